"""The conversation: one Markdown block per message, kept scrolled to the newest while it grows."""
from __future__ import annotations

from markdown_it import MarkdownIt
from markdown_it.token import Token
from textual.containers import VerticalScroll
from textual.widgets import Markdown

ROLE_TITLES = {"user": "you", "assistant": "assistant"}
FLUSH_S = 0.05  # the ring can commit ~100 pieces a second; re-parsing the Markdown 20 times a second reads as smooth


def _hard_breaks(state) -> None:
    """Every line break of a paragraph is kept: a model's haiku or list of lines is not one run-on paragraph
    (Markdown joins single line breaks; a chat answer means them)."""
    for token in state.tokens:
        for child in token.children or ():
            if child.type == "softbreak":
                child.type = "hardbreak"


def _items_shown(state) -> None:
    """A list item that would show nothing shows the text after its marker instead. A model counting ("1. 1. 2.
    3. 4.") writes, to Markdown, lists nested in lists down to an empty item, which Textual draws as nothing at
    all, the numbers included; the item now holds "1. 2. 3. 4." as text. Any other Markdown renders as before."""
    tokens, out, i = state.tokens, [], 0
    while i < len(tokens):
        t = tokens[i]
        out.append(t)
        i += 1
        if t.type != "list_item_open" or t.map is None:
            continue
        end, depth = i, 1  # its list_item_close
        while depth:
            depth += tokens[end].nesting
            end += 1
        end -= 1
        if any(x.nesting == 0 and (x.type != "inline" or x.content.strip()) for x in tokens[i:end]):
            continue  # something of it shows
        rest = state.src.split("\n")[t.map[0]].split(t.info + t.markup, 1)[-1].strip()
        if not rest:
            continue  # a bare marker: nothing was swallowed
        inline = Token("inline", "", 0, map=t.map, level=t.level + 2, content=rest, children=[])
        state.md.inline.parse(rest, state.md, state.env, inline.children)
        out += [Token("paragraph_open", "p", 1, map=t.map, level=t.level + 1), inline,
                Token("paragraph_close", "p", -1, level=t.level + 1)]
        i = end  # on to its list_item_close
    state.tokens = out


def chat_markdown() -> MarkdownIt:
    md = MarkdownIt("gfm-like")
    md.core.ruler.after("inline", "items_shown", _items_shown)
    md.core.ruler.push("hard_breaks", _hard_breaks)
    return md


class ChatMessage(Markdown):
    def __init__(self, role: str, content: str = "") -> None:
        super().__init__(content, classes=role, parser_factory=chat_markdown)
        self.role = role
        self.border_title = ROLE_TITLES.get(role, role)
        self.streamed = ""
        self._unwritten = ""
        self._stream = self._timer = None

    def start_stream(self) -> None:
        """Grow this message as text arrives: batched on a timer, then through Textual's MarkdownStream."""
        self._stream = Markdown.get_stream(self)
        self._timer = self.set_interval(FLUSH_S, self._flush)

    def feed(self, text: str) -> None:
        self.streamed += text
        self._unwritten += text

    async def _flush(self) -> None:
        if self._unwritten and self._stream is not None:
            text, self._unwritten = self._unwritten, ""
            await self._stream.write(text)

    async def end_stream(self, final: str | None = None) -> None:
        if self._stream is None:
            return
        self._timer.stop()
        await self._flush()
        await self._stream.stop()
        self._stream = None
        if final is not None and final != self.streamed:
            await self.update(final)  # the last decode can differ from the streamed pieces at the very end


class Conversation(VerticalScroll):
    def on_mount(self) -> None:
        self.anchor()  # follow the end as the answer streams, until the user scrolls up

    async def add(self, role: str, content: str = "") -> ChatMessage:
        msg = ChatMessage(role, content)
        await self.mount(msg)
        return msg

    async def show(self, messages: list[dict]) -> None:
        """Replace what is shown with these messages (a new or a reopened chat)."""
        await self.remove_children()
        await self.mount_all([ChatMessage(m["role"], m["content"]) for m in messages])
        self.anchor()
