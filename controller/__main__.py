"""`python -m controller [OPTIONS]`: the same as `mqcontroller` / `rocketq controller start`."""

from controller.cli import mqcontroller

if __name__ == "__main__":
    mqcontroller(prog_name="python -m controller")
