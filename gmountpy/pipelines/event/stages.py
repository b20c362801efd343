"""The event-recognition stages, one process per stage per document, each reading the previous file.

    python -m gmountpy.pipelines.event.stages split     docs/P.xml  sent/P.json
    python -m gmountpy.pipelines.event.stages tokenize  sent/P.json tok/P.json
    python -m gmountpy.pipelines.event.stages tag       tok/P.json  pos/P.json    # part of speech + lemma
    python -m gmountpy.pipelines.event.stages entities  pos/P.json  ent/P.json    # dictionary tagging
    python -m gmountpy.pipelines.event.stages events    ent/P.json  ev/P.tsv      # trigger + arguments
    python -m gmountpy.pipelines.event.stages aggregate events.tsv ev/*.tsv

Only spaCy's rule-based machinery is used (no model can be downloaded
here): a blank English pipeline's tokenizer and sentencizer, an
AttributeRuler for part of speech and lemmas (a small lexicon plus suffix
rules, because spacy-lookups-data is not installed), an EntityRuler with the
gene/protein dictionary, and a Matcher over lemma, part of speech and entity
type for the events. Every stage is deterministic, so a run on any node
gives the same bytes.
"""

from __future__ import annotations

import json
import os
import sys
import xml.etree.ElementTree as ET
from typing import Any, cast

import spacy
from spacy.language import Language
from spacy.matcher import Matcher
from spacy.pipeline import AttributeRuler, EntityRuler
from spacy.tokens import Doc

from .corpus import ENTITIES, TRIGGERS

ENTITY_LABEL = "GGP"  # gene or gene product, as in the BioNLP shared tasks

_CLOSED_CLASS = {
    "DET": ["the", "a", "an", "this", "these", "that", "those", "its", "their"],
    "ADP": ["of", "in", "by", "with", "for", "on", "at", "from", "after", "between", "about", "into", "via"],
    "CCONJ": ["and", "or", "but"],
    "SCONJ": ["that", "whether"],
    "PRON": ["we", "it", "they", "which"],
    "AUX": ["is", "are", "was", "were", "be", "been", "has", "have", "had"],
    "ADV": ["directly", "strongly", "thereby", "moreover", "here", "little", "not", "also", "in vivo"],
    "VERB": ["show", "found", "controls", "suggest", "confirmed", "measured", "known", "using", "requires"],
}
_AUX_LEMMA = {"is": "be", "are": "be", "was": "be", "were": "be", "been": "be", "has": "have", "had": "have"}
_VERB_LEMMA = {"found": "find", "controls": "control", "confirmed": "confirm", "measured": "measure",
               "known": "know", "using": "use", "requires": "require", "show": "show", "suggest": "suggest"}


def _blank() -> Language:
    return spacy.blank("en")


def _read_json(path: str) -> Any:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _write(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)  # a half-written file never looks finished to make or Snakemake


def _dump(path: str, data: Any) -> None:
    _write(path, json.dumps(data, ensure_ascii=False, indent=1, sort_keys=True) + "\n")


# --------------------------------------------------------------------------- stages


def split(source: str, out: str) -> None:
    """Title + abstract text of each MedlineCitation (one, or a MedlineCitationSet of many), split into
    sentences (sentencizer); each sentence of a batch carries its citation's PMID and its index there."""
    root = ET.parse(source).getroot()
    citations = [root] if root.tag == "MedlineCitation" else root.findall("MedlineCitation")
    nlp = _blank()
    nlp.add_pipe("sentencizer")
    sentences: list[dict[str, Any]] = []
    for citation in citations:
        pmid = (citation.findtext("PMID") or "").strip()
        text = " ".join(t.strip() for t in (citation.findtext("Article/ArticleTitle"),
                                             citation.findtext("Article/Abstract/AbstractText")) if t)
        for index, s in enumerate(nlp(text).sents):
            sentence: dict[str, Any] = {"start": s.start_char, "text": s.text}
            if len(citations) > 1:
                sentence.update(pmid=pmid, index=index)
            sentences.append(sentence)
    first = (citations[0].findtext("PMID") or "").strip() if citations else ""
    _dump(out, {"pmid": first, "sentences": sentences})


def tokenize(source: str, out: str) -> None:
    data = _read_json(source)
    tokenizer = _blank().tokenizer
    for sentence in data["sentences"]:
        sentence["tokens"] = [[t.text, t.whitespace_] for t in tokenizer(sentence["text"])]
    _dump(out, data)


def _tagger(nlp: Language) -> AttributeRuler:
    ruler = cast(AttributeRuler, nlp.add_pipe("attribute_ruler"))
    patterns: list[dict[str, Any]] = [
        # suffix rules first; the lexicon below overrides them (later patterns win)
        {"patterns": [[{"IS_ALPHA": True}]], "attrs": {"POS": "NOUN"}},
        {"patterns": [[{"IS_PUNCT": True}]], "attrs": {"POS": "PUNCT"}},
        {"patterns": [[{"LIKE_NUM": True}]], "attrs": {"POS": "NUM"}},
        {"patterns": [[{"LOWER": {"REGEX": r"^[a-z]+ly$"}}]], "attrs": {"POS": "ADV"}},
        {"patterns": [[{"LOWER": {"REGEX": r"^[a-z]+(ed|ing)$"}}]], "attrs": {"POS": "VERB"}},
        {"patterns": [[{"LOWER": {"REGEX": r"^[a-z]+(al|ic|ive|ous|ar)$"}}]], "attrs": {"POS": "ADJ"}},
        {"patterns": [[{"TEXT": {"REGEX": r"^[A-Z][A-Za-z]*[0-9A-Z]+$"}}]], "attrs": {"POS": "PROPN"}},
    ]
    for pos, words in _CLOSED_CLASS.items():
        for word in words:
            lemma = _AUX_LEMMA.get(word) or _VERB_LEMMA.get(word) or word
            pattern = [{"LOWER": w} for w in word.split()]
            patterns.append({"patterns": [pattern], "attrs": {"POS": pos, "LEMMA": lemma}})
    for lemma, (_, third, participle, nominal) in sorted(TRIGGERS.items()):
        forms = {third.split()[0]: "VERB", participle.split()[0]: "VERB", lemma: "VERB", nominal: "NOUN"}
        for form, pos in forms.items():
            patterns.append({"patterns": [[{"LOWER": form}]], "attrs": {"POS": pos, "LEMMA": lemma}})
    ruler.add_patterns(patterns)
    return ruler


def _lemma(text: str, pos: str) -> str:
    """Lemmas the lexicon did not give: lower case, plural nouns made singular."""
    word = text if pos == "PROPN" else text.lower()
    if pos == "NOUN" and len(word) > 3 and word.endswith("s") and not word.endswith(("ss", "us", "is")):
        return word[:-3] + "y" if word.endswith("ies") else word[:-1]
    return word


def tag(source: str, out: str) -> None:
    data = _read_json(source)
    nlp = _blank()
    ruler = _tagger(nlp)
    for sentence in data["sentences"]:
        words = [t for t, _ in sentence["tokens"]]
        doc = ruler(Doc(nlp.vocab, words=words, spaces=[bool(ws) for _, ws in sentence["tokens"]]))
        sentence["tokens"] = [[t.text, t.whitespace_, t.pos_ or "X", t.lemma_ or _lemma(t.text, t.pos_)]
                              for t in doc]
    _dump(out, data)


def entities(source: str, out: str) -> None:
    data = _read_json(source)
    nlp = _blank()
    ruler = cast(EntityRuler, nlp.add_pipe("entity_ruler"))
    ruler.add_patterns([{"label": ENTITY_LABEL, "pattern": name} for name in ENTITIES])
    for sentence in data["sentences"]:
        tokens = sentence["tokens"]
        doc = ruler(Doc(nlp.vocab, words=[t[0] for t in tokens], spaces=[bool(t[1]) for t in tokens]))
        iob = ["O"] * len(doc)
        for ent in doc.ents:
            for i in range(ent.start, ent.end):
                iob[i] = ("B-" if i == ent.start else "I-") + ent.label_
        sentence["tokens"] = [t + [tag_] for t, tag_ in zip(tokens, iob, strict=True)]
        sentence["entities"] = [ent.text for ent in doc.ents]
    _dump(out, data)


def _event_matcher(nlp: Language) -> Matcher:
    triggers = sorted(TRIGGERS)
    ent = {"ENT_TYPE": ENTITY_LABEL}
    adv = {"POS": "ADV", "OP": "?"}
    verb = {"LEMMA": {"IN": triggers}, "POS": "VERB"}
    noun = {"LEMMA": {"IN": triggers}, "POS": "NOUN"}
    matcher = Matcher(nlp.vocab)
    # cause first: "A (directly) binds B", "A interacts with B"
    matcher.add("ACTIVE", [[ent, adv, verb, ent], [ent, adv, verb, {"LOWER": "with"}, ent]])
    # theme first: "B is (strongly) phosphorylated by A"
    matcher.add("PASSIVE", [[ent, {"POS": "AUX"}, adv, verb, {"LOWER": "by"}, ent]])
    # "the phosphorylation of B by A"
    matcher.add("NOMINAL", [[noun, {"LOWER": "of"}, ent, {"LOWER": "by"}, ent]])
    return matcher


def events(source: str, out: str) -> None:
    """Event = trigger + theme (+ cause), from the sentence's entities and trigger words."""
    data = _read_json(source)
    nlp = _blank()
    matcher = _event_matcher(nlp)
    merge = nlp.add_pipe("merge_entities")
    rows = []
    for index, sentence in enumerate(data["sentences"]):
        tokens = sentence["tokens"]
        doc = Doc(nlp.vocab, words=[t[0] for t in tokens], spaces=[bool(t[1]) for t in tokens],
                  pos=[t[2] for t in tokens], lemmas=[t[3] for t in tokens], ents=[t[4] for t in tokens])
        doc = merge(doc)
        seen = set()
        for match_id, start, end in matcher(doc):
            span = doc[start:end]
            kind = nlp.vocab.strings[match_id]
            trigger = next(t for t in span if t.lemma_ in TRIGGERS and t.pos_ in ("VERB", "NOUN"))
            args = [t.text for t in span if t.ent_type_ == ENTITY_LABEL]
            cause, theme = (args[0], args[1]) if kind == "ACTIVE" else (args[1], args[0])
            if trigger.i in seen:
                continue
            seen.add(trigger.i)
            rows.append("\t".join([sentence.get("pmid", data["pmid"]), str(sentence.get("index", index)),
                                   TRIGGERS[trigger.lemma_][0], trigger.text,
                                   trigger.lemma_, theme, cause]))
    _write(out, "".join(row + "\n" for row in rows))


COLUMNS = ["pmid", "sentence", "type", "trigger", "lemma", "theme", "cause"]


def aggregate(out: str, *sources: str) -> None:
    """One table of every document's events, ordered by document (the order of the arguments does not matter)."""
    rows = []
    for source in sources:
        with open(source, encoding="utf-8") as f:
            rows += [line.rstrip("\n").split("\t") for line in f if line.strip()]
    rows.sort(key=lambda r: (r[0], int(r[1]), r[3], r[5]))
    _write(out, "\t".join(COLUMNS) + "\n" + "".join("\t".join(r) + "\n" for r in rows))


STAGES = {"split": split, "tokenize": tokenize, "tag": tag, "entities": entities, "events": events}


def main(argv: list[str]) -> int:
    if argv[:1] == ["aggregate"] and len(argv) >= 2:
        aggregate(argv[1], *argv[2:])
        return 0
    if len(argv) != 3 or argv[0] not in STAGES:
        print(__doc__, file=sys.stderr)
        return 2
    STAGES[argv[0]](argv[1], argv[2])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
