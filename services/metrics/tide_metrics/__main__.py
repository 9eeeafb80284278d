from tide.runtime import run_service

from tide_metrics.service import MetricsService


def main() -> None:
    run_service("metrics", MetricsService)


if __name__ == "__main__":
    main()
