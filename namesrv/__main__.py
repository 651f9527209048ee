"""`python -m namesrv [OPTIONS]`: the same as `mqnamesrv` / `rocketq namesrv start`."""

from namesrv.cli import mqnamesrv

if __name__ == "__main__":
    mqnamesrv(prog_name="python -m namesrv")
