"""WHALE command line."""

def main() -> None:
    raise SystemExit("not yet")
