"""Section citations resolve inside the repository: every `design §N` names a section of docs/design.md and every
`style §N` one of docs/style.md, in src, tests, benchmarks, docs and the README; the design notes that lived
outside the repository are cited nowhere any more (their names are spelled in pieces below, so that a grep for
them finds nothing here either)."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = {"design": ROOT / "docs" / "design.md", "style": ROOT / "docs" / "style.md"}
SCANNED = ("src", "tests", "benchmarks", "docs", "README.md")
TEXT_SUFFIXES = {".py", ".md", ".sh", ".txt", ".toml", ".cfg", ".ini", ".yaml", ".yml", ".rst"}
# A citation of the old external files: their upper-case names followed by a section sign or a section number.
OLD_FILES = "|".join(("SP" + "EC", "STY" + "LE"))
FORBIDDEN = re.compile(rf"\b(?:{OLD_FILES})\s*§|\b(?:{OLD_FILES})\s+\d+\.\d+")
HEADING = re.compile(r"^#{1,6}\s+§(\d+(?:\.\d+)*)\b", re.MULTILINE)
# `word §a.b` or `§a.b-c.d`; the word before the sign says which document a citation is in
CITATION = re.compile(r"(?:([\w./-]+)\s+)?§(\d+(?:\.\d+)*)(?:-(\d+(?:\.\d+)*))?")
CONTINUE = {None, "and", "or", "see", "in", "also"}  # `design §6.1 and §6.6`, `(design §8, §11.4)`: same document


def sections(doc: Path) -> set[str]:
    """The section numbers of a doc: its headings that start with §N."""
    return set(HEADING.findall(doc.read_text(encoding="utf-8")))


def citations(text: str, default: str | None = None) -> list[tuple[int, str, str]]:
    """(line number, document, section) of every citation of design.md or style.md in `text`. A bare §N continues
    the document last named on its line (`default` when none is: the doc's own sections inside that doc); a §N
    after any other word (`optimal.md §7`, `P1 §3.2`) belongs to another document and is skipped."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        current = default
        for m in CITATION.finditer(line):
            word, first, last = m.group(1), m.group(2), m.group(3)
            name = word.lower().removeprefix("docs/").removesuffix(".md") if word else None
            if name in DOCS:
                current = name
            elif name not in CONTINUE:
                current = None
            if current is not None:
                found.extend((number, current, s) for s in (first, last) if s is not None)
    return found


def scanned_files() -> list[Path]:
    files = []
    for entry in SCANNED:
        path = ROOT / entry
        candidates = [path] if path.is_file() else sorted(path.rglob("*"))
        files.extend(f for f in candidates if f.is_file() and f.suffix in TEXT_SUFFIXES)
    return files


def _own_doc(path: Path) -> str | None:
    return next((name for name, doc in DOCS.items() if doc == path), None)


def test_every_design_and_style_citation_names_an_existing_section():
    known = {name: sections(doc) for name, doc in DOCS.items()}
    assert all(known.values()), "docs/design.md and docs/style.md have § headings"
    missing, total = [], 0
    for path in scanned_files():
        for line, doc, section in citations(path.read_text(encoding="utf-8", errors="replace"), _own_doc(path)):
            total += 1
            if section not in known[doc]:
                missing.append(f"{path.relative_to(ROOT)}:{line}: {doc} §{section}")
    assert total > 100, f"only {total} citations found: the scan or the pattern is broken"
    assert not missing, "citations of sections that do not exist:\n" + "\n".join(missing)


def test_no_citation_of_files_outside_the_repository():
    hits = [f"{path.relative_to(ROOT)}:{i}: {line.strip()}"
            for path in scanned_files()
            for i, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1)
            if FORBIDDEN.search(line)]
    assert not hits, "cite docs/design.md (design §N) or docs/style.md (style §N) instead:\n" + "\n".join(hits)


def test_the_checks_catch_what_they_are_for():
    """Broken inputs are caught: a missing section, a range end, a continued list, and the old citations."""
    d, s = "design", "style"  # spelled apart, so that this file's own scan sees no citation here
    text = (f"x ({d} §3.5) and the loss (§99.1)\n"
            f"see docs/optimal.md §7 and P1 §3.2\n"
            f"{s} §2.4; {d} §1.2-1.3, §4.7\n")
    assert citations(text) == [(1, "design", "3.5"), (1, "design", "99.1"), (3, "style", "2.4"),
                               (3, "design", "1.2"), (3, "design", "1.3"), (3, "design", "4.7")]
    assert citations("see §2.1", default="design") == [(1, "design", "2.1")]
    assert "99.1" not in sections(DOCS["design"])
    old = OLD_FILES.split("|")
    assert FORBIDDEN.search(f"(see {old[0]} §4.1)") and FORBIDDEN.search(f"# checks first ({old[1]} 2.9)")
    assert not FORBIDDEN.search("SPEC = VerifierSpec(") and not FORBIDDEN.search(f"{d} §4.1")
