"""Reasoning text: a thinking model's `<think> ... </think>` block, split from its answer.

Qwen3, DeepSeek-R1 distills and their kin think aloud before answering. llama-server's
`--reasoning-format deepseek` (its default `auto` for such models) returns that part as
`message.reasoning_content` and only the answer as `content`, streamed as
`delta.reasoning_content` then `delta.content`; OpenAI clients that know the field show
it apart. `ReasoningSplitter` does that split on streamed text: a reply that starts
(after whitespace) with `<think>`, or whose prompt already opened the block (the
generation prompt ends with `<think>`), is reasoning up to `</think>`; the answer after it
loses its leading whitespace. An unclosed block is all reasoning. A reply without the tag
is all content, unchanged.

What lives here: the splitter and the format names. What does not: where the formats are
chosen (completions.py create_chat_completion, the server's --reasoning-format) and the
response shapes (responses.py).
"""

from __future__ import annotations

from ..errors import EdgeKVError

OPEN, CLOSE = "<think>", "</think>"
FORMATS = ("none", "deepseek", "auto")  # none: the text as generated (llama-cpp-python's behaviour)


def check_format(name: str) -> bool:
    """Whether `name` asks for a split; an EdgeKVError naming the choices when it is unknown."""
    if name not in FORMATS:
        raise EdgeKVError(f"reasoning_format {name!r} is not one of {', '.join(FORMATS)}")
    return name != "none"


def opened_by(prompt: str, opening: str = OPEN) -> bool:
    """Whether the rendered prompt leaves the model inside a think block (its generation
    prompt ends with an open `<think>`, or the family's own opening tag)."""
    text = prompt.rstrip()
    return text.endswith(opening)


class ReasoningSplitter:
    """push(text) -> (reasoning, content) released so far; finish() -> what was held back.
    Text that might be the start of a tag is held until it is known not to be."""

    def __init__(self, inside: bool = False, tags: tuple[str, str] = (OPEN, CLOSE)):
        """inside: the prompt opened the block; tags: the block's opening and closing (a
        family's own, such as Command R's <|START_THINKING|> ... <|END_THINKING|>)."""
        self.state = "reasoning" if inside else "start"
        self.open, self.close = tags
        self.held = ""
        self.started = {"reasoning": False, "content": False}  # leading whitespace of each part is dropped
        # (of the answer only after a think block)

    def push(self, text: str) -> tuple[str, str]:
        self.held += text
        if self.state == "start":
            lead = self.held.lstrip()
            if lead.startswith(self.open):
                self.state, self.held = "reasoning", lead[len(self.open):]
            elif self.open.startswith(lead):  # empty, or a prefix of the tag: wait for more
                return "", ""
            else:  # no think block: the text as generated
                self.state, self.started["content"] = "content", True
        if self.state == "content":
            return "", self._release("content", len(self.held))
        at = self.held.find(self.close)
        if at < 0:  # hold back what may be the start of the closing tag
            return self._release("reasoning", len(self.held) - partial_suffix(self.held, self.close)), ""
        reasoning = self._release("reasoning", at)
        self.held, self.state = self.held[len(self.close):], "content"
        return reasoning, self._release("content", len(self.held))

    def _release(self, part: str, n: int) -> str:
        out, self.held = self.held[:n], self.held[n:]
        if not self.started[part]:
            out = out.lstrip()
            self.started[part] = bool(out)
        return out

    def whole(self, text: str) -> tuple[str, str]:
        """push(text) and finish(): the rest of the reply, all of it released."""
        reasoning, content = self.push(text)
        more_reasoning, more_content = self.finish()
        return reasoning + more_reasoning, content + more_content

    def finish(self) -> tuple[str, str]:
        if self.state == "reasoning":
            return self._release("reasoning", len(self.held)), ""
        if self.state == "start":  # only whitespace or part of the tag came: that is the answer
            self.started["content"] = True
        return "", self._release("content", len(self.held))


def partial_suffix(text: str, tag: str) -> int:
    """The length of the longest end of text that is a start of tag."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


def split(text: str, inside: bool = False) -> tuple[str, str]:
    """(reasoning, content) of a whole reply."""
    reasoning, content = ReasoningSplitter(inside).whole(text)
    return reasoning.rstrip(), content  # the leading whitespace of each part is already gone
