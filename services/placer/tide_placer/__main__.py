from tide.runtime import run_service

from tide_placer.service import PlacerService


def main() -> None:
    run_service("placer", PlacerService)


if __name__ == "__main__":
    main()
