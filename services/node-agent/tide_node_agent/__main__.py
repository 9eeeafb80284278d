from tide.runtime import run_service

from tide_node_agent.service import NodeAgent


def main() -> None:
    run_service("node-agent", NodeAgent)


if __name__ == "__main__":
    main()
