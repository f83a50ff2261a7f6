"""Text <-> token ids, and chat prompts, for one served model."""
from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property

import jinja2.ext
import tokenizers
from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from otel_llm.server.model.token_floor import TokenFloor, token_floor
from otel_llm.server.model.incremental_decoder import IncrementalDecoder


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


class Tokenizer:
    """A ``tokenizers.Tokenizer`` plus the model's chat template and stop ids.

    Thread-safety: encode/decode/apply_chat_template are safe to call from any
    thread; each ``IncrementalDecoder`` belongs to one stream.
    """

    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        *,
        eos_token_ids: tuple[int, ...],
        chat_template: str | None,
        bos_token: str = "",
        eos_token: str = "",
    ) -> None:
        self._backend = backend
        self.eos_token_ids = eos_token_ids
        self.vocab_size: int = backend.get_vocab_size(with_added_tokens=True)
        self._bos_token = bos_token
        self._eos_token = eos_token
        self._template = None
        if chat_template is not None:
            # Same environment as Hugging Face's apply_chat_template.
            env = ImmutableSandboxedEnvironment(
                trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
            )
            env.globals["raise_exception"] = _raise_exception
            self._template = env.from_string(chat_template)

    @property
    def backend(self) -> tokenizers.Tokenizer:
        """The wrapped ``tokenizers.Tokenizer``."""
        return self._backend

    @cached_property
    def floor(self) -> TokenFloor | None:
        """At least how many tokens a text is, without tokenizing it (`token_floor`); None where
        the tokenizer allows no such floor. Computed on first use (it reads the whole vocabulary)."""
        return token_floor(self._backend)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of ``text``; special-token strings in ``text`` map to their ids.

        Through `encode_batch_fast`: the same ids as `encode`, without offsets (half the
        time), and the GIL is released while it runs (`encode` keeps it: 5 s for 10 MB of
        text, during which no other thread of the process runs)."""
        return self._backend.encode_batch_fast([text], add_special_tokens=add_special_tokens)[0].ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Text of ``ids``; an incomplete UTF-8 sequence decodes to U+FFFD."""
        return self._backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        """Id of a vocabulary entry (e.g. ``"<|im_end|>"``), or None."""
        return self._backend.token_to_id(token)

    def apply_chat_template(
        self, messages: Sequence[dict], add_generation_prompt: bool = True
    ) -> str:
        """Render ``messages`` (dicts with ``role`` and ``content``) as a prompt string.

        Encode the result with ``encode(prompt)``: the template already holds any
        BOS text. Raises ValueError if the model has no chat template or the
        template rejects the messages.
        """
        if self._template is None:
            raise ValueError("this model has no chat template")
        try:
            return self._template.render(
                messages=list(messages),
                add_generation_prompt=add_generation_prompt,
                bos_token=self._bos_token,
                eos_token=self._eos_token,
            )
        except TemplateError as exc:
            raise ValueError(f"chat template failed: {exc}") from exc

    def incremental_decoder(self, skip_special_tokens: bool = True) -> IncrementalDecoder:
        """A new streaming detokenizer for one generated sequence."""
        return IncrementalDecoder(self.decode, skip_special_tokens=skip_special_tokens)
