"""lm-eval's logging while sensprof drives it: only errors. Both the eval run (lm_eval_run.py) and the model type
(lm_eval_model.py) use it, so it lives below both; it imports nothing of lm-eval."""

from __future__ import annotations

import contextlib
import logging


@contextlib.contextmanager
def quiet_lm_eval(name: str = "lm_eval", level: int = logging.ERROR):
    """lm-eval logs a warning per model built from a loaded model, and notes per task; keep only errors."""
    logger = logging.getLogger(name)
    was = logger.level
    logger.setLevel(level)
    try:
        yield
    finally:
        logger.setLevel(was)
