"""Text from users and the store (run names, error texts, paths) shown as text: every
Markdown and directive character is backslash-escaped, so `[click](https://…)` stays those
characters and never becomes a link, `__getitem__` keeps its underscores, and HTML is never
rendered (unsafe_allow_html is never set)."""
from __future__ import annotations

import re

_SPECIAL = re.compile(r"([\\`*_{}\[\]()#+\-.!|<>~$:&=])")


def plain(value: object) -> str:
    """`value` as literal text for st.markdown-like elements (banners, captions)."""
    text = _SPECIAL.sub(r"\\\1", str(value))
    return text.replace("\n", "  \n")  # keep line breaks as breaks, not paragraphs
