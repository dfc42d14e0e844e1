"""Special tokens, add-BOS/EOS flags, merges and the chat template of a Hugging Face tokenizer.

What lives here: `special_vocab` and `SpecialVocab.keys`, the behaviour of gguf-py's
SpecialVocab as llama.cpp's converter (the reference source tree) runs it: merges from
tokenizer.json (either format) or merges.txt; add-BOS/EOS/SEP from the post-processor
(ByteLevel, RobertaProcessing, TemplateProcessing) before tokenizer_config.json; special
token ids by content through tokenizer.json's added tokens, then config.json's *_token_id;
the chat template from tokenizer_config.json, chat_template.jinja or chat_template.json;
lowercase / strip-accents normalizers. The PyPI gguf package ships an older SpecialVocab
(its post-processor rules differ), so edgekv carries this one. What does not: the tokens
themselves (vocab.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from .json_files import json_file

TYPES = ("bos", "eos", "unk", "sep", "pad", "cls", "mask")
_ID_KEYS = {"bos": "bos_token_id", "eos": "eos_token_id", "unk": "unknown_token_id", "sep": "seperator_token_id",
            "pad": "padding_token_id", "mask": "mask_token_id", "eot": "eot_token_id", "eom": "eom_token_id"}
_ADD_KEYS = ("bos", "eos", "sep")  # the add_*_token flags llama.cpp's writer has


@dataclass
class SpecialVocab:
    n_vocab: int | None
    load_merges: bool = False
    types: tuple[str, ...] = TYPES
    merges: list[str] = field(default_factory=list)
    ids: dict[str, int] = field(default_factory=dict)
    add: dict[str, bool] = field(default_factory=dict)
    chat_template: object = None
    lowercase: bool | None = None
    strip_accents: bool | None = None

    def set_id(self, typ: str, tid) -> None:
        if isinstance(tid, int) and not isinstance(tid, bool) and tid >= 0 and typ not in self.ids \
                and (self.n_vocab is None or tid < self.n_vocab):
            self.ids[typ] = tid

    def keys(self, w) -> None:
        """Add the keys through a gguf GGUFWriter, in add_to_gguf's order."""
        if self.merges:
            w.add_token_merges(self.merges)
        for typ, tid in self.ids.items():
            if typ in _ID_KEYS:
                w.add_uint32(f"tokenizer.ggml.{_ID_KEYS[typ]}", tid)
        for typ, value in self.add.items():
            if typ in _ADD_KEYS:
                w.add_bool(f"tokenizer.ggml.add_{typ}_token", value)
        if self.lowercase is not None:
            w.add_bool("tokenizer.ggml.normalizer.lowercase", self.lowercase)
        if self.strip_accents is not None:
            w.add_bool("tokenizer.ggml.normalizer.strip_accents", self.strip_accents)
        if self.chat_template is not None:
            _chat_template(w, self.chat_template)


def _chat_template(w, template) -> None:
    if isinstance(template, str):
        w.add_string("tokenizer.chat_template", template)
        return
    names = []
    for t in template:  # [{"name", "template"}]: the default plus named ones
        name = "".join(c if c.isalnum() else "_" for c in t["name"])
        if name == "default":
            w.add_string("tokenizer.chat_template", t["template"])
        else:
            names.append(name)
            w.add_string(f"tokenizer.chat_template.{name}", t["template"])
    if names:
        w.add_array("tokenizer.chat_templates", names)


def _merges(tokenizer: dict) -> list[str]:
    merges = tokenizer.get("model", {}).get("merges")
    if not isinstance(merges, list) or not merges:
        return []
    if isinstance(merges[0], str):
        return merges
    # [a, b] pairs; a space inside a part is written as U+0120 so "a b" stays splittable
    return [" ".join("".join(chr(ord(c) + 256) if c == " " else c for c in part) for part in pair) for pair in merges]


def _merges_txt(directory: str) -> list[str]:
    path = os.path.join(directory, "merges.txt")
    if not os.path.isfile(path):
        return []
    with open(path, encoding="utf-8") as f:
        lines = [ln.strip() for ln in f]
    if lines and lines[0].startswith("#"):
        lines = lines[1:]
    return [" ".join(ln.split(None, 1)) for ln in lines if ln and len(ln.split()) == 2]


def _normalizer(sv: SpecialVocab, n: dict) -> None:
    kind = n.get("type")
    if kind == "Lowercase":
        sv.lowercase = True
    elif kind == "StripAccents":
        sv.strip_accents = True
    elif kind == "BertNormalizer":
        sv.lowercase = n.get("lowercase", sv.lowercase)
        sv.strip_accents = n.get("strip_accents", sv.strip_accents)
    elif kind == "Sequence":
        for sub in n.get("normalizers", []):
            _normalizer(sv, sub)


def _template_processing(sv: SpecialVocab, proc: dict, tc: dict | None, special: dict) -> None:
    """TemplateProcessing's single template: a leading BOS/CLS, a trailing EOS (or an EOT/EOM
    that the EOS is then moved to); its pair template: a separator."""
    single, pair = proc.get("single", []), proc.get("pair", [])
    first = last = None
    if len(single) > 1:
        if first := single[0].get("SpecialToken", {}).get("id"):
            if not tc:
                special["bos"] = first
            elif first not in (special["bos"], special["cls"]):
                if not special["bos"]:
                    tc["bos_token"] = special["bos"] = first
                if not special["cls"]:
                    tc["cls_token"] = special["cls"] = first
            sv.add["bos"] = first in (special["bos"], special["cls"])
        if last := single[-1].get("SpecialToken", {}).get("id"):
            if not tc:
                special["eos"] = last
            elif last != special["eos"]:
                for extra in ("eot", "eom"):
                    if extra not in sv.types:
                        sv.types = tuple(sv.types) + (extra,)
                        tc[f"{extra}_token"] = special["eos"]
                        break
                tc["eos_token"] = special["eos"] = last
            sv.add["eos"] = last == special["eos"]
    if not pair:
        return
    start = 1 if first and pair[0].get("SpecialToken", {}).get("id") == first else 0
    stop = -1 if last and pair[-1].get("SpecialToken", {}).get("id") == last else None
    middle = pair[start:stop]
    if len(middle) < 3 or middle[0].get("Sequence", {}).get("id") != "A" \
            or middle[-1].get("Sequence", {}).get("id") != "B":
        return
    middle = middle[1:-1]
    add_sep = False
    if entry := middle[0].get("SpecialToken", {}).get("id"):
        add_sep = entry in (special["sep"], special["eos"]) and not last
    if len(middle) == 2 and (entry := middle[1].get("SpecialToken", {}).get("id")):
        add_sep = add_sep or entry in (special["sep"], special["eos"])
    sv.add["sep"] = add_sep
    if add_sep and not special["sep"] and tc:
        tc["sep_token"] = special["eos"]


def _from_tokenizer_files(sv: SpecialVocab, directory: str) -> None:
    tokenizer = json_file(directory, "tokenizer.json")
    tc = json_file(directory, "tokenizer_config.json")
    added = []
    if tokenizer:
        if sv.load_merges:
            sv.merges = _merges(tokenizer)
        if normalizer := tokenizer.get("normalizer"):
            _normalizer(sv, normalizer)
        added = tokenizer.get("added_tokens", [])
        special = {t: (tc or {}).get(f"{t}_token") for t in ("bos", "cls", "eos", "sep")}
        if not special["bos"] and special["cls"] and tc:
            tc["bos_token"] = special["bos"] = special["cls"]
        if not special["eos"] and special["sep"] and tc:
            tc["eos_token"] = special["eos"] = special["sep"]
        post = tokenizer.get("post_processor") or {}
        for proc in post.get("processors", [post]) if post else []:
            if proc.get("type") == "ByteLevel":
                sv.add.setdefault("bos", False)
                sv.add.setdefault("eos", False)
            elif proc.get("type") == "RobertaProcessing":
                sv.add.update(bos=True, eos=True, sep=True)
                if not special["cls"] and tc:
                    tc["cls_token"] = special["cls"] = proc.get("cls", [special["bos"]])[0]
                if not special["sep"] and tc:
                    tc["sep_token"] = special["sep"] = proc.get("sep", [special["eos"]])[0]
            elif proc.get("type") == "TemplateProcessing":
                _template_processing(sv, proc, tc, special)
    if not tc:
        return
    sv.chat_template = tc.get("chat_template", _chat_template_file(directory))
    if not (sv.chat_template is None or isinstance(sv.chat_template, (str, list))):
        sv.chat_template = None
    for typ in sv.types:
        flag = tc.get(f"add_{typ}_token")
        if isinstance(flag, bool) and typ not in sv.add:
            sv.add[typ] = flag
        entry = tc.get(f"{typ}_token")
        content = entry.get("content") if isinstance(entry, dict) else entry
        if isinstance(content, str):
            sv.set_id(typ, next((a.get("id") for a in added if a.get("content") == content), None))


def _chat_template_file(directory: str):
    jinja = os.path.join(directory, "chat_template.jinja")
    if os.path.isfile(jinja):
        with open(jinja, encoding="utf-8") as f:
            template = f.read()
        extra_dir = os.path.join(directory, "additional_chat_templates")
        extra = sorted(p for p in os.listdir(extra_dir) if p.endswith(".jinja")) if os.path.isdir(extra_dir) else []
        if not extra:
            return template
        out = [{"name": "default", "template": template}]
        for p in extra:
            with open(os.path.join(extra_dir, p), encoding="utf-8") as f:
                out.append({"name": p[:-len(".jinja")], "template": f.read()})
        return out
    data = json_file(directory, "chat_template.json")
    return data.get("chat_template") if data else None


def special_vocab(directory: str, *, load_merges: bool = False, n_vocab: int | None = None) -> SpecialVocab:
    sv = SpecialVocab(n_vocab, load_merges)
    _from_tokenizer_files(sv, directory)
    config = json_file(directory, "config.json")
    for typ in sv.types:
        tid = config.get(f"{typ}_token_id")
        if tid is None and "text_config" in config:
            tid = config["text_config"].get(f"{typ}_token_id")
        sv.set_id(typ, tid)
    if load_merges and not sv.merges:
        sv.merges = _merges_txt(directory)
    return sv
