"""python-telegram-bot integration: durable ingest and fenced update processors."""

from ptb_fence.ptb._application import FencedApplication, FencedApplicationMixin
from ptb_fence.ptb._context import AttemptUnavailable, FencedCallbackContext
from ptb_fence.ptb._persistence import FencedPersistence
from ptb_fence.ptb._processor import BaseFenceProcessor, DurableUpdateProcessor, FencedUpdateProcessor
from ptb_fence.ptb._bodies import IngestError, update_body
from ptb_fence.ptb._job_queue import FencedJob, FencedJobQueue, JobRunHandler
from ptb_fence.ptb._queue import DurableUpdateQueue
from ptb_fence.runtime._job_callbacks import register_job_callback

__all__ = [
    "AttemptUnavailable",
    "BaseFenceProcessor",
    "DurableUpdateProcessor",
    "DurableUpdateQueue",
    "FencedApplication",
    "FencedApplicationMixin",
    "FencedCallbackContext",
    "FencedJob",
    "FencedJobQueue",
    "FencedPersistence",
    "FencedUpdateProcessor",
    "IngestError",
    "JobRunHandler",
    "register_job_callback",
    "update_body",
]
