"""Medline-like abstracts for the event-recognition pipeline, deterministic from a seed.

Each document is one MedlineCitation XML file: a title and an abstract of
realistic sentences about genes and proteins -- some state interactions
(binding, phosphorylation, activation, inhibition, expression), some only
mention the proteins, some are background. The vocabulary below is also the
pipeline's dictionary (entity names) and trigger list (interaction verbs).
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from xml.sax.saxutils import escape

GENES = [
    "TP53", "MDM2", "BRCA1", "BRCA2", "EGFR", "ERBB2", "AKT1", "MAPK1", "MAPK3", "STAT3", "JAK2", "SRC",
    "MYC", "CDK2", "CDK4", "CCND1", "CDKN1A", "KRAS", "RAF1", "MAP2K1", "PIK3CA", "PTEN", "mTOR", "RPS6KB1",
    "GSK3B", "CTNNB1", "APC", "NFKB1", "RELA", "IKBKB", "TNF", "IL6", "IL1B", "TGFB1", "SMAD2", "SMAD4",
    "VEGFA", "HIF1A", "VHL", "BCL2", "BAX", "CASP3", "CASP9", "XIAP", "SIRT1", "FOXO3", "ATM", "CHEK2",
    "E2F1", "RB1", "HDAC1", "EP300", "CREBBP", "ESR1", "AR", "SP1", "JUN", "FOS", "NOTCH1", "HES1",
]
PROTEIN_NAMES = ["p53", "p21", "cyclin D1", "beta-catenin", "NF-kappaB", "IkappaB alpha", "c-Myc", "Ras",
                 "ERK2", "Akt", "PI3K", "Bcl-2", "caspase-3", "STAT3", "JNK"]
ENTITIES = GENES + PROTEIN_NAMES

# trigger lemma -> (event type, 3rd person, past participle, nominal)
TRIGGERS = {
    "bind": ("Binding", "binds", "bound", "binding"),
    "interact": ("Binding", "interacts with", "interacted with", "interaction"),
    "phosphorylate": ("Phosphorylation", "phosphorylates", "phosphorylated", "phosphorylation"),
    "activate": ("Positive_regulation", "activates", "activated", "activation"),
    "induce": ("Positive_regulation", "induces", "induced", "induction"),
    "inhibit": ("Negative_regulation", "inhibits", "inhibited", "inhibition"),
    "suppress": ("Negative_regulation", "suppresses", "suppressed", "suppression"),
    "regulate": ("Regulation", "regulates", "regulated", "regulation"),
    "degrade": ("Protein_catabolism", "degrades", "degraded", "degradation"),
    "ubiquitinate": ("Ubiquitination", "ubiquitinates", "ubiquitinated", "ubiquitination"),
}
CELLS = ["HeLa", "HEK293", "MCF-7", "A549", "HepG2", "U2OS", "Jurkat", "primary fibroblast"]
DISEASES = ["breast cancer", "colorectal cancer", "glioblastoma", "type 2 diabetes", "rheumatoid arthritis",
            "hepatocellular carcinoma", "Alzheimer disease"]
METHODS = ["co-immunoprecipitation", "a yeast two-hybrid screen", "mass spectrometry", "an in vitro kinase assay",
           "chromatin immunoprecipitation", "surface plasmon resonance"]
JOURNALS = ["J Biol Chem", "Mol Cell Biol", "Oncogene", "Cancer Res", "EMBO J", "Nucleic Acids Res", "Cell Signal"]


def _event_sentence(rng: random.Random) -> str:
    a, b = rng.sample(ENTITIES, 2)
    lemma = rng.choice(sorted(TRIGGERS))
    _, third, participle, nominal = TRIGGERS[lemma]
    cell, method = rng.choice(CELLS), rng.choice(METHODS)
    form = rng.randrange(6)
    if form == 0:
        return f"{a} directly {third} {b} in {cell} cells."
    if form == 1:
        return f"We show that {b} is {participle} by {a} in vivo."
    if form == 2:
        return f"The {nominal} of {b} by {a} was confirmed by {method}."
    if form == 3:
        return f"Here, {a} {third} {b} and thereby controls cell proliferation."
    if form == 4:
        return f"Using {method}, we found that {a} {third} {b}."
    return f"Moreover, {b} was strongly {participle} by {a} after serum stimulation."


def _other_sentence(rng: random.Random) -> str:
    a, b = rng.sample(ENTITIES, 2)
    disease, cell = rng.choice(DISEASES), rng.choice(CELLS)
    form = rng.randrange(5)
    if form == 0:
        return f"Mutations in {a} are frequent in {disease}."
    if form == 1:
        return f"The expression of {a} and {b} was measured in {cell} cells."
    if form == 2:
        return f"These results suggest a novel mechanism in the pathogenesis of {disease}."
    if form == 3:
        return f"Little is known about the role of {a} in {disease}."
    return (f"Levels of {a} were elevated in {rng.randint(12, 240)} patients with {disease} "
            f"(P < 0.0{rng.randint(1, 5)}).")


def abstract(pmid: int, rng: random.Random) -> str:
    a, disease = rng.choice(ENTITIES), rng.choice(DISEASES)
    title = f"{a} signalling in {disease}: {rng.choice(['a role for', 'regulation of', 'new insights into'])} " \
            f"{rng.choice(ENTITIES)}"
    sentences = [_other_sentence(rng) if rng.random() < 0.45 else _event_sentence(rng)
                 for _ in range(rng.randint(5, 10))]
    text = " ".join(sentences)
    year = rng.randint(1998, 2012)
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n'
            f'<MedlineCitation Owner="NLM" Status="MEDLINE">\n'
            f'  <PMID Version="1">{pmid}</PMID>\n'
            f'  <DateCreated><Year>{year}</Year><Month>{rng.randint(1, 12):02d}</Month>'
            f'<Day>{rng.randint(1, 28):02d}</Day></DateCreated>\n'
            f'  <Article PubModel="Print">\n'
            f'    <Journal><Title>{escape(rng.choice(JOURNALS))}</Title></Journal>\n'
            f'    <ArticleTitle>{escape(title)}.</ArticleTitle>\n'
            f'    <Abstract><AbstractText>{escape(text)}</AbstractText></Abstract>\n'
            f'    <Language>eng</Language>\n'
            f'  </Article>\n'
            f'</MedlineCitation>\n')


def pmids(n: int, seed: int = 158) -> list[int]:
    if n < 1:
        raise ValueError(f"`n` must be at least 1, got {n}")
    return [10_000_000 + seed * 1000 + i for i in range(n)]


def batch(pmid: int, abstracts: int, seed: int = 158) -> str:
    """A MedlineCitationSet of `abstracts` citations (PMIDs pmid*10000 + j): a document batch as an archive
    ships them, a few MiB for a few thousand abstracts."""
    parts = []
    for j in range(abstracts):
        sub = pmid * 10000 + j
        one = abstract(sub, random.Random(f"{seed}-{pmid}-{j}"))
        parts.append(one.split("\n", 1)[1])  # without its XML declaration
    return ('<?xml version="1.0" encoding="UTF-8"?>\n<MedlineCitationSet>\n' + "".join(parts)
            + "</MedlineCitationSet>\n")


def write_corpus(n: int, destination: Callable[[int, str], str], seed: int = 158,
                 abstracts: int = 1) -> list[tuple[int, str]]:
    """Write n documents; `destination(i, name)` gives the path of document i (name: PMID.xml). A document is
    one abstract, or with `abstracts` > 1 a batch of that many (a MedlineCitationSet)."""
    if abstracts < 1:
        raise ValueError(f"`abstracts` must be at least 1, got {abstracts}")
    written = []
    for i, pmid in enumerate(pmids(n, seed)):
        path = destination(i, f"{pmid}.xml")
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(path, "w") as f:
            f.write(abstract(pmid, random.Random(f"{seed}-{pmid}")) if abstracts == 1 else batch(pmid, abstracts, seed))
        written.append((pmid, path))
    return written


def main(argv: list[str]) -> int:
    """python -m gmountpy.pipelines.event.corpus N DIR: DIR/docs/PMID.xml, for one directory."""
    import sys

    if len(argv) != 2 or not argv[0].isdigit():
        print("usage: python -m gmountpy.pipelines.event.corpus N DIRECTORY", file=sys.stderr)
        return 2
    write_corpus(int(argv[0]), lambda i, name: os.path.join(argv[1], "docs", name))
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
