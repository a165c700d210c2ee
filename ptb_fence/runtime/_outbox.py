"""Outbox: the Bot API calls a handler queues, sent iff its attempt committed them."""

from __future__ import annotations

import json
from typing import Any, Dict, Mapping, Optional, Protocol, Tuple, Union

from ptb_fence._dbapi import transaction_ended
from ptb_fence._errors import TransactionEnded, UsageError
from ptb_fence._values import AttemptEffects, AttemptIdentity, OutboxCall, StateWrite
from ptb_fence.runtime._bot_params import api_method, params_json, to_json_value
from ptb_fence.runtime._chats import chat_key, stored_chat_key
from ptb_fence.runtime._effects import HeldEffects, OpenTransaction
from ptb_fence.runtime._held_call import HeldCall
from ptb_fence.runtime._outbox_prepare import OutboxPrepare
from ptb_fence.runtime._phase import AttemptHost

__all__ = ["Outbox", "OutboxOwner", "QueuedCall"]

QueuedCall = Union[int, HeldCall]
"""What :meth:`Outbox.call` returns: the outbox id of a call written inside a fenced
transaction, or the :class:`~ptb_fence.HeldCall` of a call held for the completion."""

_ENDED = (
    "was {how} inside the block before this outbox call: the call was refused (a call "
    "written now would not commit with the fenced transaction); do not commit or roll back "
    "the connection inside the block"
)

_MESSAGE_FIELDS = (
    "message", "edited_message", "channel_post", "edited_channel_post", "business_message",
    "edited_business_message",
)


def _file_reference(name: str, value: Any) -> Any:
    """A ``photo``/``document`` given as file id or URL (a PTB ``PhotoSize``/``Document``
    stands for its ``file_id``). Anything to upload is refused."""
    if isinstance(value, str):
        return value
    file_id = getattr(value, "file_id", None)
    from_ptb = type(value).__module__.startswith("telegram")
    if isinstance(file_id, str) and from_ptb and type(value).__name__ != "InputFile":
        return file_id
    to_json_value(value, name)  # raises the upload error for files, paths and bytes
    raise UsageError(f"{name} must be a file_id or URL string, got {type(value).__name__}")


class OutboxOwner(Protocol):
    """What an :class:`Outbox` needs of its attempt (:class:`~ptb_fence.Attempt`)."""

    update_id: int
    attempt: int

    @property
    def identity(self) -> AttemptIdentity: ...

    @property
    def update(self) -> Any: ...

    @property
    def body(self) -> Optional[str]: ...

    @property
    def host(self) -> AttemptHost: ...

    @property
    def effects(self) -> HeldEffects: ...

    def open_transaction(self) -> Optional[OpenTransaction]: ...

    def raise_if_finished(self) -> None: ...


class Outbox:
    """The Bot API calls of one attempt, sent iff the attempt's commit carried them.

    A handler gets it as ``attempt.outbox`` (``context.attempt.outbox`` in PTB). Every method
    queues one call and returns at once. Nothing goes to Telegram from here:

    - Inside an open fenced transaction of this attempt, the call's row is inserted through
      that transaction. It commits or rolls back with it. The call's outbox id (:obj:`int`)
      is returned.
    - Anywhere else in the handler, the attempt holds the call. The commit that completes the
      update writes it. A :class:`~ptb_fence.HeldCall` is returned. A failed or stale
      attempt's held calls never commit.

    After the commit the process's dispatcher sends the calls at least once, each chat's in
    order (see the tutorial, "Replies through the outbox").

    Parameters are keyword arguments as the Bot API (and PTB's ``Bot`` methods) name them.
    PTB objects are kept as their ``to_dict()``, and :obj:`None` values are left out. The bot's
    ``Defaults`` apply as PTB applies them. Files go by ``file_id`` or URL only, since the
    outbox keeps JSON. A call with ``at_most_once=True`` whose request got no answer is
    reported failed (``unknown outcome``) instead of sent again.
    """

    __slots__ = ("_attempt", "_defaults", "_prepare", "_update")

    def __init__(self, attempt: OutboxOwner, defaults: Mapping[str, Any],
                 prepare: "Optional[OutboxPrepare]" = None) -> None:
        self._attempt = attempt
        self._defaults = defaults
        self._prepare = prepare
        self._update: Optional[Dict[str, Any]] = None

    def __repr__(self) -> str:
        return f"Outbox(update_id={self._attempt.update_id}, attempt={self._attempt.attempt})"

    # -- the update being handled -----------------------------------------------------------
    def _update_dict(self) -> Dict[str, Any]:
        if self._update is None:
            update = self._attempt.update
            if update is not None and callable(getattr(update, "to_dict", None)):
                update = update.to_dict()
            if not isinstance(update, dict):
                body = self._attempt.body
                update = json.loads(body) if body else {}
            self._update = update if isinstance(update, dict) else {}
        return self._update

    def _message(self) -> Dict[str, Any]:
        update = self._update_dict()
        for name in _MESSAGE_FIELDS:
            message = update.get(name)
            if isinstance(message, dict):
                return message
        query = update.get("callback_query")
        if isinstance(query, dict) and isinstance(query.get("message"), dict):
            message = query["message"]
            if isinstance(message.get("chat"), dict) and "message_id" in message:
                return dict(message)
        raise ValueError(
            f"update {self._attempt.update_id} has no message to reply to; use "
            "send_message(chat_id, text) instead"
        )

    # -- queueing -----------------------------------------------------------------------------
    def call(self, method: str, *, at_most_once: bool = False, **params: Any) -> QueuedCall:
        """Queue the Bot API call ``method(**params)``.

        Args:
            method: The Bot API method (``"sendMessage"``, PTB's ``"send_message"`` works too).
            at_most_once: If the request leaves and no answer comes back (a timeout, a
                dropped connection), record the call failed (``unknown outcome``) instead of
                sending it again. Calls that are safe to repeat (edits, deletes,
                ``answerCallbackQuery``) are always repeated.
            **params: The call's parameters.

        Returns:
            :obj:`int` | :class:`~ptb_fence.HeldCall`: Inside a fenced transaction of this
            attempt, the call's outbox id. Elsewhere the handle of the held call.

        Raises:
            AttemptFinished: The attempt completed, was exhausted or its handler returned:
                no commit of it can carry the call any more.
            TypeError: A parameter the outbox cannot keep as JSON (a file to upload).
            ValueError: ``method`` is not a method name.
        """
        attempt = self._attempt
        attempt.raise_if_finished()
        name = api_method(method)
        opened = attempt.open_transaction()
        state: Tuple[StateWrite, ...] = ()
        if self._prepare is not None:
            params, state = self._prepare(name, dict(params), opened is not None)
        text = params_json(name, params, self._defaults)
        chat = params.get("chat_id")
        if chat is None:
            key = stored_chat_key(chat_key(self._update_dict()))
        else:
            key = stored_chat_key(chat) if not isinstance(chat, str) else _int_or_none(chat)
        effects = attempt.effects
        call = OutboxCall(name, text, key, effects.next_seq(), bool(at_most_once))
        if opened is not None:
            ended = transaction_ended(opened.connection) if opened.checkable else None
            if ended is not None:  # its commit would not be the fenced one: never written
                raise TransactionEnded(attempt.identity, ended, _ENDED.format(how=ended))
            port = attempt.host.port
            call_id = port.write_effects(
                attempt.identity,
                AttemptEffects(calls=(call,), state=state),
                attempt.host.now_ms(),
                connection=opened.connection,
            )[0]
            opened.wrote_calls = True
            opened.call_ids.append(call_id)
            return call_id
        handle = HeldCall(attempt.identity, call.seq, name)
        try:
            effects.hold_call(call, handle)
        except RuntimeError as exc:
            from ptb_fence._errors import AttemptFinished

            raise AttemptFinished(attempt.identity, str(exc)) from None
        return handle

    def send_message(self, chat_id: Union[int, str], text: str, **kw: Any) -> QueuedCall:
        """Queue ``sendMessage`` (keywords as :meth:`telegram.Bot.send_message`)."""
        return self.call("sendMessage", chat_id=chat_id, text=text, **kw)

    def reply_text(
        self,
        text: str,
        *,
        do_quote: Optional[bool] = None,
        reply_to_message_id: Optional[int] = None,
        reply_parameters: Any = None,
        allow_sending_without_reply: Optional[bool] = None,
        message_thread_id: Optional[int] = None,
        **kw: Any,
    ) -> QueuedCall:
        """Queue a reply to the update's message, as ``update.effective_message.reply_text``
        would send it: to the message's chat, in its forum topic (``message_thread_id`` of a
        topic message), quoting it (``reply_parameters``) in groups and channels but not in
        private chats unless ``do_quote`` (or ``Defaults(do_quote=...)``) says otherwise, in
        the message's business connection.

        Args:
            text: The reply's text.
            do_quote: Quote the message (:obj:`True`), do not (:obj:`False`), or PTB's default
                (:obj:`None`).
            reply_to_message_id: Reply to this message instead.
            reply_parameters: Explicit ``ReplyParameters`` (wins over ``do_quote``).
            allow_sending_without_reply: Sent even if the quoted message is gone.
            message_thread_id: Another topic (default: the message's own, for a topic message).
            **kw: Further ``sendMessage`` parameters (``reply_markup``, ``parse_mode``,
                ``at_most_once``, ...).

        Raises:
            ValueError: The update has no message (use :meth:`send_message`).
        """
        message = self._message()
        chat = message.get("chat") or {}
        if reply_parameters is not None:
            reply: Any = to_json_value(reply_parameters, "reply_parameters")
        elif reply_to_message_id is not None:
            reply = {"message_id": reply_to_message_id}
        else:
            quote = do_quote if do_quote is not None else self._defaults.get("do_quote")
            if quote is None:
                quote = chat.get("type") != "private"
            reply = {"message_id": message.get("message_id")} if quote else None
        if reply is not None and allow_sending_without_reply is not None:
            reply = dict(reply, allow_sending_without_reply=allow_sending_without_reply)
        if message_thread_id is None and message.get("is_topic_message"):
            message_thread_id = message.get("message_thread_id")
        topic = message.get("direct_messages_topic")
        if isinstance(topic, dict) and "direct_messages_topic_id" not in kw:
            kw["direct_messages_topic_id"] = topic.get("topic_id")
        if message.get("business_connection_id") and "business_connection_id" not in kw:
            kw["business_connection_id"] = message["business_connection_id"]
        return self.call(
            "sendMessage",
            chat_id=chat.get("id"),
            text=text,
            message_thread_id=message_thread_id,
            reply_parameters=reply,
            **kw,
        )

    def edit_message_text(
        self,
        text: str,
        chat_id: Union[int, str, None] = None,
        message_id: Optional[int] = None,
        inline_message_id: Optional[str] = None,
        **kw: Any,
    ) -> QueuedCall:
        """Queue ``editMessageText`` (arguments as :meth:`telegram.Bot.edit_message_text`).
        Repeated when its outcome is unknown (an edit is safe to repeat)."""
        return self.call(
            "editMessageText",
            text=text,
            chat_id=chat_id,
            message_id=message_id,
            inline_message_id=inline_message_id,
            **kw,
        )

    def edit_message_reply_markup(
        self,
        chat_id: Union[int, str, None] = None,
        message_id: Optional[int] = None,
        inline_message_id: Optional[str] = None,
        reply_markup: Any = None,
        **kw: Any,
    ) -> QueuedCall:
        """Queue ``editMessageReplyMarkup`` (arguments as
        :meth:`telegram.Bot.edit_message_reply_markup`)."""
        return self.call(
            "editMessageReplyMarkup",
            chat_id=chat_id,
            message_id=message_id,
            inline_message_id=inline_message_id,
            reply_markup=reply_markup,
            **kw,
        )

    def delete_message(self, chat_id: Union[int, str], message_id: int, **kw: Any) -> QueuedCall:
        """Queue ``deleteMessage``."""
        return self.call("deleteMessage", chat_id=chat_id, message_id=message_id, **kw)

    def send_photo(self, chat_id: Union[int, str], photo: Any, **kw: Any) -> QueuedCall:
        """Queue ``sendPhoto`` of a photo given by ``file_id`` or URL (or a PTB ``PhotoSize``).

        Raises:
            TypeError: ``photo`` is a file to upload (``InputFile``, bytes, a path, an open
                file): the outbox keeps JSON. Upload it directly and queue its ``file_id``.
        """
        return self.call("sendPhoto", chat_id=chat_id, photo=_file_reference("photo", photo), **kw)

    def send_document(self, chat_id: Union[int, str], document: Any, **kw: Any) -> QueuedCall:
        """Queue ``sendDocument`` of a document given by ``file_id`` or URL (or a PTB
        ``Document``).

        Raises:
            TypeError: ``document`` is a file to upload: see :meth:`send_photo`.
        """
        return self.call(
            "sendDocument", chat_id=chat_id, document=_file_reference("document", document), **kw
        )


def _int_or_none(text: str) -> Optional[int]:
    """A chat id given as text ("-100123"): its number. A ``@username`` is not ordered."""
    try:
        return int(text)
    except ValueError:
        return None
