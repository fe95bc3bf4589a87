"""Training tasks with verifiable rewards; importing this package registers them all.

    from tokengrad.train.tasks import get_task
    task = get_task("arithmetic", digits=(1, 2), ops="+-")

Registered names: "kk" (Knights & Knaves, Logic-RL reward), "countdown", "arithmetic", "toolqa",
"lab_add" (compact addition for the CPU lab model), "lab_kk" (compact Knights & Knaves with a reasoning
trace, for the CPU lab model `lab-kk`), and "charset" (a toy task a tiny random model learns,
for demos and pipeline tests).
"""

# Importing a task module registers its factory.
from tokengrad.train.tasks import arithmetic, charset, countdown, kk, lab_add, lab_kk, toolqa  # noqa: F401
from tokengrad.train.tasks.base import TASKS, Problem, Task, TaskFactory, get_task, register_task

__all__ = ["TASKS", "Problem", "Task", "TaskFactory", "get_task", "register_task"]
