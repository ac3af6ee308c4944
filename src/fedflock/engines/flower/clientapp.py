"""The fedflock ClientApp: Flower messages in, fedflock client tasks, Flower messages out.

Flower (>= 1.21) starts a process for every message, so what this module imports is paid by
every message: it imports Flower and nothing else. The work is done by
`fedflock.engines.flower.handler`, in this process, or, with `worker=true` in the node config,
by the node's long-lived worker (`fedflock.engines.flower.worker`), which keeps torch, the
node's data and its model loaded between messages (the message then costs Flower's own process
start and a round trip over a local socket). Every fedflock message type is routed
(`train.<kind>[__<kind>...]`, `query`), so a task kind registered later (a plugin's) needs no
handler of its own.
"""

from __future__ import annotations

from flwr.app import Context, Message, RecordDict
from flwr.clientapp import ClientApp

from fedflock.engines.flower.names import PREFIX, QUERY


def _answer(message: Message, context: Context) -> RecordDict:
    if str(context.node_config.get("worker", "")).lower() == "true":
        from fedflock.engines.flower.worker import ask

        content = ask(message, context)
        if content is not None:
            return content
    from fedflock.engines.flower.handler import answer  # torch and the client runtime

    return answer(message, context)


class TaskClientApp(ClientApp):
    """A ClientApp that answers every fedflock message type with `handler.answer`."""

    def __call__(self, message: Message, context: Context) -> Message:
        kind = message.metadata.message_type
        if kind.startswith(PREFIX) or kind == QUERY:
            return Message(_answer(message, context), reply_to=message)
        return super().__call__(message, context)


app = TaskClientApp()
