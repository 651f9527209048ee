def main() -> None:
    raise SystemExit("not yet")


def mqbroker() -> None:
    main()
