"""Chat templates: the Jinja2 ``chat_template`` of ``tokenizer_config.json``.

Rendered the way transformers renders it (``PreTrainedTokenizerBase.apply_chat_template``,
``utils/chat_template_utils.py``): a sandboxed Jinja2 environment with ``trim_blocks`` and
``lstrip_blocks``, the ``raise_exception`` and ``strftime_now`` helpers, a ``tojson`` filter,
the ``{% generation %}`` block (TRL's assistant-token mask: rendered as its body), and the
variables ``messages``, ``add_generation_prompt`` and the special tokens (``bos_token``,
``eos_token``, ...).
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

from .errors import InvalidRequestError


def _token_text(value: Any) -> Any:
    return value.get("content") if isinstance(value, dict) else value


def _generation_block() -> type:
    """The Jinja2 extension of ``{% generation %} ... {% endgeneration %}``, which marks the
    assistant's tokens for training (TRL's ``assistant_only_loss``; transformers'
    ``AssistantTracker``): rendering it gives its body unchanged."""
    from jinja2.ext import Extension

    class Generation(Extension):
        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            next(parser.stream)
            return parser.parse_statements(("name:endgeneration",), drop_needle=True)

    return Generation


def render_chat_template(model_dir: str | Path, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
    """Render ``messages`` with ``model_dir``'s chat template.

    Args:
        model_dir: folder with ``tokenizer_config.json`` (``chat_template`` key) or
            ``chat_template.jinja``.
        messages: ``[{"role": "user", "content": "..."}, ...]``.
        add_generation_prompt: append the assistant turn's opening.

    Raises:
        InvalidRequestError: no chat template, or the template raised (its message kept).
    """
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    model_dir = Path(model_dir)
    cfg_path = model_dir / "tokenizer_config.json"
    cfg: dict[str, Any] = json.loads(cfg_path.read_text()) if cfg_path.is_file() else {}
    template = cfg.get("chat_template")
    jinja_file = model_dir / "chat_template.jinja"
    if template is None and jinja_file.is_file():
        template = jinja_file.read_text()
    if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in template}
        template = named.get("default") or next(iter(named.values()), None)
    if not template:
        raise InvalidRequestError(f"{model_dir} has no chat template (tokenizer_config.json 'chat_template')")

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols", _generation_block()])
    # transformers' tojson: the same arguments (templates pass separators / sort_keys)
    env.filters["tojson"] = lambda x, ensure_ascii=False, indent=None, separators=None, sort_keys=False: json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )
    env.globals["raise_exception"] = raise_exception
    # today's date in the template's format (Mistral Small 3, SmolLM3 write it into the system turn)
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    specials = {k: _token_text(v) for k, v in cfg.items() if k.endswith("_token")}
    try:
        return env.from_string(template).render(messages=messages, add_generation_prompt=add_generation_prompt, **specials)
    except jinja2.exceptions.TemplateError as exc:
        raise InvalidRequestError(f"chat template failed: {exc}") from exc
    except (TypeError, ValueError, KeyError, IndexError, AttributeError) as exc:  # the messages' data did not fit it
        raise InvalidRequestError(f"chat template failed on these messages: {type(exc).__name__}: {exc}") from exc
