from tide.runtime import run_service

from tide_queue.service import QueueService


def main() -> None:
    run_service("queue", QueueService)


if __name__ == "__main__":
    main()
