#!/usr/bin/env python3
"""Reference chat-template renderer: what Hugging Face transformers' apply_chat_template(
tokenize=False) returns, rebuilt on Debian's python3-jinja2 without transformers.

usage: hf_reference.py TOKENIZER_DIR [--chat-template FILE] < request.json
prints the rendered prompt byte for byte (exit 0), or the template's error on stderr (exit 1).
The rules followed are listed in README.md beside this file; the code is written from them.
"""
import json
import os
import sys
from datetime import datetime, timezone

import jinja2
import jinja2.ext
from jinja2 import nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

# transformers' SPECIAL_TOKENS_ATTRIBUTES, in order
SPECIAL_ATTRS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
                 "mask_token", "additional_special_tokens")


class TemplateRejected(Exception):
    """The template (or jinja2 at render time) refused the request."""


class GenerationTag(jinja2.ext.Extension):
    """{% generation %}...{% endgeneration %}: only marks assistant tokens for
    return_assistant_tokens_mask; rendering text it is a no-op around its body (own scope)."""
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body).set_lineno(lineno)


def _raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # HF replaces jinja's tojson (which HTML-escapes) by plain json.dumps with these options
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _now():
    fixed = os.environ.get("TYCHO_FIXED_NOW")
    if fixed:
        return datetime.fromisoformat(fixed.replace("Z", "+00:00"))
    return datetime.now()


def _strftime_now(fmt):
    return _now().strftime(fmt)


def compile_template(source):
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(source)


def _token_str(v):
    # an AddedToken serialised in tokenizer_config.json is {"__type": "AddedToken", "content": ...}
    if isinstance(v, dict):
        return v.get("content")
    return v


def special_tokens_map(cfg):
    """tokenizer.special_tokens_map: the attributes that are set (truthy), as strings."""
    out = {}
    for attr in SPECIAL_ATTRS:
        v = cfg.get(attr)
        if attr == "additional_special_tokens":
            v = [_token_str(x) for x in (v or [])]
        else:
            v = _token_str(v)
        if v:
            out[attr] = v
    for name, v in (cfg.get("extra_special_tokens") or {}).items():
        v = _token_str(v)
        if v:
            out[name] = v
    return out


def load_tokenizer_chat(tokdir):
    """(chat_template as str or {name: template} or None, special_tokens_map)."""
    cfg = {}
    cfg_path = os.path.join(tokdir, "tokenizer_config.json")
    if os.path.exists(cfg_path):
        with open(cfg_path, encoding="utf-8") as f:
            cfg = json.load(f)
    template = cfg.get("chat_template")
    if isinstance(template, list):
        template = {t["name"]: t["template"] for t in template}
    jinja_path = os.path.join(tokdir, "chat_template.jinja")
    if os.path.exists(jinja_path):  # the separate file clobbers the config's template
        with open(jinja_path, encoding="utf-8") as f:
            template = f.read()
    return template, special_tokens_map(cfg)


def select_template(template, tools):
    """get_chat_template(None, tools): a named set gives "tool_use" when tools are passed and it
    exists, else "default"; no template at all is an error."""
    if isinstance(template, dict):
        if tools is not None and "tool_use" in template:
            return template["tool_use"]
        if "default" in template:
            return template["default"]
        raise TemplateRejected("no default chat template among " + ", ".join(template))
    if template is None:
        raise TemplateRejected("tokenizer has no chat template")
    return template


def render(tokdir, request, override=None):
    template, specials = load_tokenizer_chat(tokdir)
    if override is not None:
        with open(override, encoding="utf-8") as f:
            template = f.read()
    tools = request.get("tools")
    documents = request.get("documents")
    source = select_template(template, tools)
    # apply_chat_template(messages, tools=..., documents=..., add_generation_prompt=..., **kw):
    # template_kwargs = {**special_tokens_map, **kw}, then
    # render(messages=, tools=, documents=, add_generation_prompt=, **template_kwargs)
    kwargs = dict(specials)
    kwargs.update(request.get("chat_template_kwargs") or {})
    for named in ("messages", "tools", "documents", "add_generation_prompt"):
        kwargs.pop(named, None)
    agp = request.get("add_generation_prompt")
    if "add_generation_prompt" in (request.get("chat_template_kwargs") or {}):
        agp = request["chat_template_kwargs"]["add_generation_prompt"]
    if agp is None:
        agp = True  # the OpenAI server default (HF's own default is False)
    try:
        return compile_template(source).render(messages=request["messages"], tools=tools,
                                               documents=documents,
                                               add_generation_prompt=agp, **kwargs)
    except jinja2.exceptions.TemplateError as e:  # raise_exception, syntax and undefined errors
        raise TemplateRejected(f"{type(e).__name__}: {e}") from e
    except (TypeError, ValueError, KeyError, AttributeError, IndexError) as e:
        raise TemplateRejected(f"{type(e).__name__}: {e}") from e


def main(argv):
    if len(argv) < 2 or argv[1] in ("-h", "--help"):
        print(__doc__)
        return 0 if len(argv) >= 2 else 2
    override = None
    if "--chat-template" in argv:
        override = argv[argv.index("--chat-template") + 1]
    request = json.load(sys.stdin)
    try:
        out = render(argv[1], request, override)
    except TemplateRejected as e:
        print(e, file=sys.stderr)
        return 1
    sys.stdout.buffer.write(out.encode("utf-8"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
