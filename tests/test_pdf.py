"""`make pdf`: the whole book as one PDF, checked as a reader would open it.

The PDF must open; every chapter and appendix must start on a page of its own, in the
order of _toc.yml, under its own title; each chapter's pages must show one value the
chapter asserts, as the build printed it (a chapter not yet named in ASSERTED: its
first printed line); every picture's caption must be there and
no picture may have been turned into a bitmap; the first pages are a table of contents
whose page numbers are right; every page is numbered. The introduction links the PDF.
The last test shows that the check catches a PDF with a chapter's first pages missing.
"""

import io
import re
import subprocess
import sys
import unicodedata
from base64 import b64decode
from pathlib import Path
from urllib.parse import unquote

import pytest
from pypdf import PdfReader

import nbcheck

ROOT = nbcheck.ROOT
sys.path.insert(0, str(ROOT / "scripts"))
import book_pdf  # noqa: E402

# For each chapter, a value it asserts and how its output prints that value. The test
# checks the assertion is in the chapter's code and takes the printed text from the
# build's own output, so nothing below is a copy of an output.
ASSERTED = {
    "01-autograd-graph": (
        "a.grad.tolist() == [6.0, 8.0, 10.0]",
        r"tensor\(\[ *6\., +8\., +10\.\]\)",
    ),
    "02-detach": ("torch.equal(a.grad, torch.zeros(3))", r"^0 tensor\(\[0\., 0\., 0\.\]\)$"),
    "03-detach-inplace": ("x.grad.tolist() == [6.0, 6.0]", r"tensor\(\[6\., 6\.\]\)"),
    "04-choosing": (
        'kept["train everything"] == everything == 72 * 1024',
        r"train everything +72\.0 KiB",
    ),
    "05-hooks": ("x.grad.tolist() == [3.0, 18.0, 7.0]", r"tensor\(\[ *3\., +18\., +7\.\]\)"),
    "06-simsiam": (
        "digits.images.shape == (1797, 8, 8) and len(data.test_idx) == 500",
        r"^\(1797, 8, 8\) \d+ 500$",
    ),
    "08-who-trains": (
        "gan_orders == {",
        r"^zero_grad\(\) once +right +error +wrong: own \+ leak$",
    ),
    "09-targets": (
        '[row["update"] for row in td.values()] == [',
        r"^policy_net itself, no stop +residual gradient +n/a \(same network\) +yes$",
    ),
    "10-policy-gradients": (
        "len(without_stops) == 1 and without_stops[0] < 1e-6",
        r"^\[0\.0\]$",
    ),
    "11-rewritten": ("vq == {", r"^codebook +None +non-zero +None$"),
    "12-ddp": (
        'seen[0]["tensor hook"] == [2.0] * 3 and seen[1]["tensor hook"] == [4.0] * 3',
        r"^rank 0: its hook saw \[2\.0, 2\.0, 2\.0\], \.grad then held \[3\.0, 3\.0, 3\.0\]$",
    ),
    "13-compile": (
        'all(row["w.grad"] == (10 * x**2).tolist() for row in grads.values())',
        r"^inductor +\[10\.0, 40\.0, 90\.0\] +CompiledFunctionBackward$",
    ),
}


def squeeze(text: str) -> str:
    """Text compared as a reader sees it: NFKC (ligatures, CJK radicals), no spaces."""
    return re.sub(r"\s+", "", unicodedata.normalize("NFKC", text))


@pytest.fixture(scope="module")
def pdf(built_book):
    result = subprocess.run(
        ["make", "--no-print-directory", "pdf"], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0, f"make pdf failed:\n{(result.stdout + result.stderr)[-6000:]}"
    return book_pdf.pdf_path()


def titles(html_root: Path) -> list[str]:
    """Each page's title, in the order of _toc.yml, from the built site."""
    found = []
    for doc in nbcheck.toc_files():
        h1 = nbcheck.built_page(html_root, doc).find("h1")
        found.append(h1.get_text().replace("#", "").strip())
    return found


def asserted_outputs(html_root: Path) -> dict[str, str]:
    """Chapter title -> an output line to find in the chapter's pages, from the build:
    the line showing the value named in ASSERTED; for a chapter not (yet) named there,
    its first printed line that its source does not contain."""
    chapters = [nb for nb in nbcheck.toc_notebooks() if nb.parent.name == "notebooks"]
    assert set(ASSERTED) <= {nb.stem for nb in chapters}, "ASSERTED names a missing chapter"
    outputs = {}
    for notebook in chapters:
        assertion, printed = ASSERTED.get(notebook.stem, (None, r"\S{4}"))
        nb = nbcheck.nbformat.read(notebook, as_version=4)
        code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
        if assertion is not None:
            assert f"assert {assertion}" in code, f"{notebook.name} no longer asserts {assertion}"
        page = nbcheck.built_page(html_root, notebook)
        source = squeeze("\n".join(c.source for c in nb.cells))
        lines = [
            line.strip()
            for output in page.select("div.cell_output")
            for line in output.get_text().splitlines()
        ]
        # only a line that no code or prose of the chapter contains proves an output
        shown = [line for line in lines if re.search(printed, line) and squeeze(line) not in source]
        assert shown or assertion is None, f"{notebook.name}: no output line matches {printed}"
        title = page.find("h1").get_text().replace("#", "").strip()
        if shown:
            outputs[title] = shown[0]
    return outputs


def svg_bitmaps(html_root: Path) -> int:
    """How many bitmaps the book's SVG pictures themselves embed (matplotlib's imshow)."""
    count = 0
    for doc in nbcheck.toc_files():
        for img in nbcheck.built_page(html_root, doc).select("img[src^='data:image/svg+xml']"):
            header, data = img["src"].split(",", 1)
            svg = b64decode(data).decode() if header.endswith(";base64") else unquote(data)
            count += svg.count("<image")
    return count


def pdf_bitmaps(reader: PdfReader) -> int:
    """How many distinct bitmaps the PDF holds (image XObjects, in forms too)."""
    images, forms = set(), set()

    def walk(resources):
        xobjects = resources.get_object().get("/XObject") if resources else None
        for ref in (xobjects.get_object() if xobjects else {}).values():
            found = ref.get_object()
            if found.get("/Subtype") == "/Image":
                images.add(ref.idnum)
            elif found.get("/Subtype") == "/Form" and ref.idnum not in forms:
                forms.add(ref.idnum)
                walk(found.get("/Resources"))

    for page in reader.pages:
        walk(page.get("/Resources"))
    return len(images)


def opens(page_text: str, title: str) -> bool:
    """Whether a page starts with this title (after at most a few labels, such as the
    reference list's [1] [2] … that Chromium writes before the heading)."""
    return squeeze(title) in page_text[: len(squeeze(title)) + 40]


def pdf_problems(pages: list[str], titles: list[str], outputs: dict[str, str]) -> list[str]:
    """What a reader would find wrong in the PDF's pages (their squeezed text)."""
    problems = []
    if len(pages) < len(titles):
        problems.append(f"{len(pages)} pages for {len(titles)} chapters")
    starts, after = [], 1  # the book opens with its table of contents
    for title in titles:
        start = next((i for i in range(after, len(pages)) if opens(pages[i], title)), None)
        if start is None:
            problems.append(f"no page starts with the title {title!r}")
            continue
        starts.append((title, start))
        after = start + 1
    for (title, start), (_, end) in zip(starts, [*starts[1:], (None, len(pages))], strict=True):
        if title in outputs and squeeze(outputs[title]) not in "".join(pages[start:end]):
            problems.append(f"{title!r}: its output {outputs[title]!r} is not in its pages")
    # The contents: every page before the first document (it grows with the book).
    contents = "".join(pages[: starts[0][1]] if starts else pages[:1])
    for title, start in starts:
        if f"{squeeze(title)}{start + 1}" not in contents:
            problems.append(f"the table of contents does not give {title!r} page {start + 1}")
    unnumbered = [
        i + 1 for i, text in enumerate(pages) if not text.endswith(f"{i + 1}/{len(pages)}")
    ]
    if unnumbered:
        problems.append(f"pages without their number: {unnumbered[:10]}")
    return problems


@pytest.fixture(scope="module")
def pdf_pages(pdf) -> list[str]:
    """The text of each page of the PDF, squeezed (extracted once: it takes a while)."""
    return [squeeze(page.extract_text()) for page in PdfReader(pdf).pages]


def test_pdf_has_every_chapter_its_output_and_a_numbered_contents(pdf, pdf_pages, built_book):
    problems = pdf_problems(pdf_pages, titles(built_book), asserted_outputs(built_book))
    assert problems == []
    print(f"{pdf.name}: {len(pdf_pages)} pages, {pdf.stat().st_size / 1e6:.1f} MB")


def main_path_captions(page) -> list:
    """The captions of a built page's figures on its main path: a picture inside a
    "Going deeper" box is one click away on the site and, like the box, folded in the
    PDF, which prints the main path (only the box's title line shows)."""
    return [
        caption
        for caption in page.select("figure figcaption")
        if caption.find_parent("details", class_="going-deeper") is None
    ]


def test_pdf_pictures_are_vector_with_their_captions(pdf, pdf_pages, built_book):
    assert pdf_bitmaps(PdfReader(pdf)) == svg_bitmaps(built_book), "a picture became a bitmap"
    text = "".join(pdf_pages)
    captions = [
        caption.get_text(" ").strip()
        for notebook in nbcheck.toc_notebooks()
        for caption in main_path_captions(nbcheck.built_page(built_book, notebook))
    ]
    assert len(captions) >= 10
    assert [c for c in captions if squeeze(c) not in text] == []


def test_intro_links_the_pdf(pdf, built_book):
    intro = nbcheck.built_page(built_book, "book/intro")
    (link,) = intro.select(f'a[href="../{pdf.name}"]')
    assert (built_book / pdf.name).read_bytes() == pdf.read_bytes()
    assert link.get_text() == pdf.name


def test_pdf_check_catches_a_missing_chapter(pdf_pages, built_book):
    # The PDF's pages with chapter 3's first three taken out.
    names, outputs = titles(built_book), asserted_outputs(built_book)
    chapter3 = next(t for t in names if t.startswith("3."))
    first = next(i for i, text in enumerate(pdf_pages) if opens(text, chapter3))
    broken = pdf_pages[:first] + pdf_pages[first + 3 :]
    problems = pdf_problems(broken, names, outputs)
    assert f"no page starts with the title {chapter3!r}" in problems
    assert any(p.startswith("pages without their number") for p in problems)


def test_pdf_check_catches_a_missing_output_and_a_wrong_contents(pdf_pages, built_book):
    # Chapter 1's asserted output blanked out of its pages, and the contents page
    # giving chapter 2 a page number one too high.
    names, outputs = titles(built_book), asserted_outputs(built_book)
    chapter1, chapter2 = (next(t for t in names if t.startswith(n)) for n in ("1.", "2."))
    printed = squeeze(outputs[chapter1])
    assert pdf_problems(pdf_pages, names, outputs) == []
    start = next(i for i, text in enumerate(pdf_pages) if opens(text, chapter2))
    entry = f"{squeeze(chapter2)}{start + 1}"
    broken = [text.replace(printed, "") for text in pdf_pages]
    broken[0] = broken[0].replace(entry, f"{squeeze(chapter2)}{start + 2}")
    problems = pdf_problems(broken, names, outputs)
    assert f"{chapter1!r}: its output {outputs[chapter1]!r} is not in its pages" in problems
    assert f"the table of contents does not give {chapter2!r} page {start + 1}" in problems


def test_bitmap_count_sees_a_picture_printed_as_a_bitmap():
    # A one-page PDF holding one bitmap, as a rasterised picture would be.
    from PIL import Image

    page = io.BytesIO()
    Image.new("RGB", (40, 30), "white").save(page, "PDF")
    assert pdf_bitmaps(PdfReader(page)) == 1
