"""MM-NIAH-style image haystacks (REFORM's multi-modal experiments use MM-NIAH, Wang et al. 2024): natural
text with images between its sentences, and one needle, a sentence or an image, with a question about it.
Made offline: the images are drawn with PIL (shapes in colours, short words, digits), so any length and
any number of samples can be generated without the MM-NIAH data.

* ``retrieval-text-needle``: the magic-number sentence of :mod:`.niah` at the row's depth of the text;
  the images are distractors. Recall: the sentence's tokens were gathered (as for text rows).
* ``retrieval-image-needle``: one image shows the magic number in large digits (the others show shapes
  and words); the question asks for the number shown in an image. Recall: the fraction of the needle
  image's positions among the gathered tokens (``meta["needle_image"]`` says which image it is).

The text is ``length`` tokens of the model's tokenizer; each image adds as many positions as the model's
processor gives it (16 on the tests' tiny LLaVA, 576 on LLaVA-1.5). One image per ``TOKENS_PER_IMAGE``
text tokens (at least 2), evenly spaced. Images travel in the row as PNG data URLs (``Row.images``); the
context holds ``<image>`` where each one goes, as MM-NIAH's own rows do.
"""

from __future__ import annotations

import base64
import io

from ...data.haystack import magic_number_needle
from ..rows import IMAGE_MARK, Row
from .haystack import build, sentence_pool
from .seeding import sample_rng

TASKS = ("retrieval-text-needle", "retrieval-image-needle")
DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)
TOKENS_PER_IMAGE = 1000        # text tokens per image in the haystack
MAX_IMAGES = 64
SIZE = 336                     # pixels (LLaVA-1.5's input size; processors resize anyway)
MAX_NEW_TOKENS = 32
COLOURS = {"red": (220, 40, 40), "green": (40, 170, 60), "blue": (40, 70, 220), "yellow": (235, 200, 40),
           "purple": (140, 60, 180), "orange": (240, 140, 30), "black": (20, 20, 20), "white": (245, 245, 245)}
WORDS = ("river", "candle", "garden", "pencil", "window", "rocket", "violin", "forest", "button", "mirror")


def png_data_url(image) -> str:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def distractor(rng):
    """A shape in one colour on another, with a short word or a digit: what MM-NIAH's haystack images are
    to a needle, things a VLM can describe that are not the answer."""
    from PIL import Image, ImageDraw, ImageFont
    background, fill = rng.sample(sorted(COLOURS), 2)
    image = Image.new("RGB", (SIZE, SIZE), COLOURS[background])
    draw = ImageDraw.Draw(image)
    a, b = sorted(rng.sample(range(40, SIZE - 40), 2)), sorted(rng.sample(range(40, SIZE - 40), 2))
    box = (a[0], b[0], max(a[1], a[0] + 30), max(b[1], b[0] + 30))
    shape = rng.choice(("ellipse", "rectangle", "triangle"))
    if shape == "triangle":
        draw.polygon([(box[0], box[3]), (box[2], box[3]), ((box[0] + box[2]) // 2, box[1])], fill=COLOURS[fill])
    else:
        getattr(draw, shape)(box, fill=COLOURS[fill])
    label = rng.choice(WORDS) if rng.random() < 0.5 else str(rng.randint(0, 9))
    draw.text((12, 12), label, fill=COLOURS["black" if background != "black" else "white"],
              font=ImageFont.load_default(size=36))
    return image


def number_image(value: str, rng):
    """The needle image: the number in large dark digits on a light background."""
    from PIL import Image, ImageDraw, ImageFont
    image = Image.new("RGB", (SIZE, SIZE), COLOURS[rng.choice(("white", "yellow"))])
    ImageDraw.Draw(image).text((SIZE // 2, SIZE // 2), value, fill=COLOURS["black"], anchor="mm",
                               font=ImageFont.load_default(size=64))
    return image


def generate(task: str, tok, length: int, samples: int, seed: int, haystack_dir=None, depths=None) -> list[Row]:
    pool = sentence_pool(tok, "natural", haystack_dir)
    n_images = min(MAX_IMAGES, max(2, length // TOKENS_PER_IMAGE))
    spots = [(i + 1) / (n_images + 1) for i in range(n_images)]      # evenly spaced through the text
    rows = []
    for depth in DEPTHS if depths is None else depths:
        for s in range(samples):
            rng = sample_rng(seed, "mm-niah/" + task, length, depth, s)
            needle = magic_number_needle(rng)
            images = [distractor(rng) for _ in range(n_images)]
            inserts = [(d, IMAGE_MARK) for d in spots]
            if task == "retrieval-text-needle":
                inserts.append((depth, needle.sentence))
                question, prefix, meta = needle.question, needle.answer_prefix, {}
            else:
                which = round(depth * (n_images - 1))
                images[which] = number_image(needle.answer, rng)
                question = "What is the special magic number shown in one of the images?"
                prefix, meta = "The special magic number shown in the image is", {"needle_image": which}
            built = build(tok, length, inserts, pool, rng)
            rows.append(Row(built.text, question, [needle.answer], f"mm-niah/{task}", length, prefix, depth,
                            MAX_NEW_TOKENS, s, {"metric": "contains", "tokens": built.n_tokens, **meta},
                            images=[png_data_url(im) for im in images]))
    return rows
