"""`python -m broker [OPTIONS]`: the same as `mqbroker` / `rocketq broker start`."""

from broker.cli import mqbroker

if __name__ == "__main__":
    mqbroker(prog_name="python -m broker")
