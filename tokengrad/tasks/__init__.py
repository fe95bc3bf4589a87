"""Training tasks with verifiable rewards; importing this package registers them all.

    from tokengrad.tasks import get_task
    task = get_task("arithmetic", digits=(1, 2), ops="+-")

Registered names: "kk" (Knights & Knaves, Logic-RL reward), "countdown", "arithmetic", "toolqa".
"""

from tokengrad.tasks.base import TASKS, Problem, Task, TaskFactory, get_task, register_task

# Importing a task module registers its factory.
from tokengrad.tasks import arithmetic, countdown, kk, toolqa  # noqa: F401

__all__ = ["TASKS", "Problem", "Task", "TaskFactory", "get_task", "register_task"]
