"""How large the text of every picture on a page is, as the browser draws it.

A picture is an SVG: a graph drawn by Graphviz (its labels are ``<text>``), a plot by
matplotlib (its text is drawn as glyph outlines, one ``<g id="text_N">`` group per
label, scaled to the font size: 100 units a point), shown in an ``<img>`` or inline. An
``<img>`` drawn narrower than the SVG's own width shrinks every label with it; side by
side, two pictures share the column. So each label's size is measured where it lands:
the SVG is laid out again off screen at the very size the page gives the ``<img>``, and
the size of each label is its font size times the scale from the label to the screen
(``getScreenCTM``). Folded pictures (a "Going deeper" box, a hidden cell) are opened
first, as a reader opens them, and folded again afterwards.

``label_sizes(page)`` returns the measures; ``small_labels(page)`` the pictures whose
labels are smaller than ``MINIMUM_PX``, as one line each. Both take a Playwright page
that has loaded a page of the book, so that any browser pass can call them.
"""

from __future__ import annotations

MINIMUM_PX = 10.0  # CSS pixels

MEASURE = r"""
async () => {
  const closed = [...document.querySelectorAll('article details:not([open])')];
  closed.forEach(d => { d.open = true; });
  await new Promise(done => requestAnimationFrame(() => requestAnimationFrame(done)));
  const host = document.createElement('div');
  host.style.cssText = 'position:absolute; left:-100000px; top:0; visibility:hidden';
  document.body.appendChild(host);
  const scaleOf = node => { const m = node.getScreenCTM(); return Math.hypot(m.c, m.d); };

  function labels(svg) {
    const found = [];
    for (const text of svg.querySelectorAll('text')) {
      const size = parseFloat(getComputedStyle(text).fontSize);
      const label = text.textContent.trim();
      if (label && size) found.push([label, size * scaleOf(text)]);
    }
    for (const group of svg.querySelectorAll('g[id^="text_"]')) {  // matplotlib
      const glyphs = [...group.children].find(
        e => e.tagName === 'g' && /scale\(/.test(e.getAttribute('transform') || ''));
      if (!glyphs) continue;
      const comment = [...group.childNodes].find(n => n.nodeType === Node.COMMENT_NODE);
      found.push([comment ? comment.data.trim() : group.id, 100 * scaleOf(glyphs)]);
    }
    return found;
  }

  async function source(img) {
    const src = img.currentSrc || img.src;
    if (src.startsWith('data:image/svg+xml')) {
      const [head, data] = src.split(',', 2);
      return head.endsWith(';base64')
        ? new TextDecoder().decode(Uint8Array.from(atob(data), c => c.charCodeAt(0)))
        : decodeURIComponent(data);
    }
    if (/\.svg([?#]|$)/i.test(src)) return (await fetch(src)).text();
    return null;
  }

  const pictures = [];
  for (const img of document.querySelectorAll('article img')) {
    const text = await source(img);
    if (!text) continue;
    const style = getComputedStyle(img);
    const px = name => parseFloat(style[name]) || 0;
    const width = img.clientWidth - px('paddingLeft') - px('paddingRight');
    const height = img.clientHeight - px('paddingTop') - px('paddingBottom');
    const svg = new DOMParser().parseFromString(text, 'image/svg+xml').documentElement;
    if (svg.tagName !== 'svg' || width <= 0 || height <= 0) continue;
    if (!svg.getAttribute('viewBox')) {
      svg.setAttribute('viewBox', `0 0 ${img.naturalWidth} ${img.naturalHeight}`);
    }
    svg.setAttribute('width', width);
    svg.setAttribute('height', height);
    const copy = host.appendChild(document.importNode(svg, true));
    pictures.push({alt: img.alt || img.getAttribute('src').slice(0, 60), width,
                   natural: img.naturalWidth, labels: labels(copy)});
    copy.remove();
  }
  for (const svg of document.querySelectorAll('article svg')) {
    if (svg.closest('mjx-container') || svg.parentElement.closest('svg')) continue;
    const found = labels(svg);
    if (found.length) {
      pictures.push({alt: svg.getAttribute('aria-label') || 'an inline SVG',
                     width: svg.getBoundingClientRect().width, natural: null, labels: found});
    }
  }
  host.remove();
  closed.forEach(d => { d.open = false; });
  return pictures;
}
"""


def label_sizes(page) -> list[dict]:
    """Every picture of the page's article: {alt, width (as drawn), natural (its own
    width, for an <img>), labels: [(text, size in CSS px)]}."""
    return page.evaluate(MEASURE)


def small_labels(page, minimum: float = MINIMUM_PX) -> list[str]:
    """One line for each picture with labels smaller than ``minimum`` pixels."""
    problems = []
    for picture in label_sizes(page):
        small = sorted((size, text) for text, size in picture["labels"] if size < minimum)
        if not small:
            continue
        size, text = small[0]
        drawn = f"drawn {picture['width']:.0f} px wide"
        if picture["natural"]:
            drawn += f" of its {picture['natural']} px"
        problems.append(
            f"{picture['alt'][:70]!r}: {len(small)} of {len(picture['labels'])} labels "
            f"under {minimum:g} px (smallest {size:.1f} px, {text[:30]!r}); {drawn}"
        )
    return problems


def smallest(page) -> float | None:
    """The smallest label of the page, in CSS px (None: no picture with text)."""
    sizes = [size for picture in label_sizes(page) for _, size in picture["labels"]]
    return min(sizes, default=None)
