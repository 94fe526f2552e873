"""Prompt -> token ids, the one way the engine, the trainer and the CLI turn a prompt into ids.

A prompt is a string, a list of chat messages ({"role", "content"} with string content), or a
list of token ids. Strings go through the chat template when the model has one (unless
``chat=False``); messages always do. A model without a chat template reads messages as their
contents joined by blank lines (what a base model would be given by hand). Every malformed
prompt raises ValueError here, before anything is queued: the tokenizer's own TypeErrors and
pyo3 panics would otherwise escape as something no caller expects.
"""
from __future__ import annotations


def prompt_to_ids(tokenizer, prompt, vocab_size: int, chat: bool | None = None) -> list[int]:
    if isinstance(prompt, (list, tuple)) and prompt and isinstance(prompt[0], dict):
        return _message_ids(tokenizer, list(prompt))
    if isinstance(prompt, (list, tuple)):
        return _token_ids(prompt, vocab_size)
    if not isinstance(prompt, str) or not prompt:
        raise ValueError("prompt must be a non-empty string, a token list or chat messages, "
                         f"got {_describe(prompt)}")
    _check_text(prompt, "prompt")
    use_chat = tokenizer.has_chat_template if chat is None else chat
    if use_chat:
        return _message_ids(tokenizer, [{"role": "user", "content": prompt}])
    return _encode(tokenizer, prompt, add_special_tokens=True)


def _token_ids(prompt, vocab_size: int) -> list[int]:
    if not prompt or not all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        raise ValueError("a token prompt must be a non-empty list of ints")
    bad = [t for t in prompt if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"prompt token ids out of range [0, {vocab_size}): {bad[:5]}")
    return list(prompt)


def _message_ids(tokenizer, messages: list) -> list[int]:
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or "content" not in m:
            raise ValueError(f"bad chat message {m!r}: needs a 'role' and a 'content' string")
        if not isinstance(m["content"], str):
            raise ValueError(f"chat message content must be a string, got "
                             f"{_describe(m['content'])} (role {m['role']!r})")
        _check_text(m["content"], "chat message content")
    if not tokenizer.has_chat_template:
        return _encode(tokenizer, "\n\n".join(m["content"] for m in messages),
                       add_special_tokens=True)
    try:
        text = tokenizer.apply_chat_template(messages)
    except ValueError:
        raise
    except Exception as e:  # a template's own error (jinja2 raises many kinds)
        raise ValueError(f"the chat template failed on these messages: {e}") from None
    return _encode(tokenizer, text, add_special_tokens=False)  # the template adds the specials


def _encode(tokenizer, text: str, add_special_tokens: bool) -> list[int]:
    ids = tokenizer.encode(text, add_special_tokens=add_special_tokens)
    if not ids:
        raise ValueError("the prompt encodes to no tokens")
    return ids


def _check_text(text: str, what: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:  # lone surrogates: text no tokenizer can represent
        raise ValueError(f"{what} is not valid Unicode text ({e.reason} at index {e.start})") \
            from None


def _describe(x) -> str:
    return f"{type(x).__name__} {x!r}"[:80]
