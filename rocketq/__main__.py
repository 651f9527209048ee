"""`python -m rocketq ...`: the same as the `rocketq` command."""

from rocketq.cli import main

if __name__ == "__main__":
    main(prog_name="python -m rocketq")
