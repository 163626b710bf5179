from tests.strategies.conftest import task_identity  # noqa: F401  (flwr Messages need a task identity)
