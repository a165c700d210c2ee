"""Tutorial step 6: watching it run.

The processor serves its probes and metrics over HTTP (``probe_port=``). The script reads
``/healthz``, ``/readyz`` and ``/metrics`` while the bot runs, as Kubernetes and Prometheus
would, then prints what ``stats()`` counted. Run it with
``python examples/tutorial/step6_watching_it_run.py`` (``/metrics`` needs the ``[metrics]``
extra: ``python -m pip install -e '.[metrics]'``).
"""

import asyncio
import socket
import tempfile
import urllib.request
from pathlib import Path

from telegram import Update
from telegram.ext import Application, CommandHandler, ContextTypes

from ptb_fence import Exhaustion, SQLiteUpdateStore
from ptb_fence.ptb import FencedCallbackContext, FencedUpdateProcessor
from ptb_fence.testing import FakeBotApi


async def ping(update: Update, context: FencedCallbackContext) -> None:
    context.require_attempt().outbox.reply_text("pong")


def gave_up(exhaustion: Exhaustion) -> None:
    print(f"gave up on update {exhaustion.update_id}: {exhaustion.error}")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as answer:
        return f"{answer.status} {answer.read().decode().strip()}"


async def main(path: str) -> None:
    store = SQLiteUpdateStore(path)
    port = free_port()  # in production a fixed port, e.g. 9102
    processor = FencedUpdateProcessor(store, handle_exhaustion=gave_up, probe_port=port)
    with FakeBotApi(first_update_id=1000) as telegram:
        builder = (Application.builder().token(telegram.token).base_url(telegram.base_url)
                   .context_types(ContextTypes(context=FencedCallbackContext)))
        app = processor.install(builder).build()
        app.add_handler(CommandHandler("ping", ping))
        async with app:
            assert app.updater is not None
            await app.start()
            await app.updater.start_polling(poll_interval=0)
            telegram.inject_message(chat_id=1, text="/ping")
            while not telegram.sent_messages:
                await asyncio.sleep(0.05)
            base = f"http://127.0.0.1:{port}"
            print("/healthz:", await asyncio.to_thread(get, base + "/healthz"))  # liveness
            print("/readyz:", await asyncio.to_thread(get, base + "/readyz"))  # readiness
            metrics = await asyncio.to_thread(get, base + "/metrics")  # for Prometheus
            print([line for line in metrics.splitlines()
                   if line.startswith("ptb_fence_attempts_started_total")])
            await app.updater.stop()
            await app.stop()
    stats = processor.stats()
    print("recorded:", stats.updates_recorded, "completed:", stats.attempts_ended["completed"],
          "replies sent:", stats.calls_sent)
    store.close()


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as scratch:
        asyncio.run(main(str(Path(scratch) / "tutorial.db")))
