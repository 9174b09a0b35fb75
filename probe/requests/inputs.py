"""Encoding what a model reads (:class:`Encoded`): sequences of exactly ``tokens`` real
tokens, as in the paper, or images.  The request for them is :class:`probe.Inputs`
(:mod:`probe.requests.request`); this module turns it into ids or pixels and a mask.

The paper probes 32 sequences of 128 tokens with no padding.  probe tokenizes a
text (```text` FILE``, or the sample text written for this project) without
special tokens and cuts it into consecutive chunks of ``tokens`` ids.  The text is
tokenized once per run, in batches of large pieces (a fast tokenizer works on a batch in
parallel), and only as far as the sequences asked for need: a 32-sequence run over a large
corpus does not tokenize all of it.  A piece ends after the newline of "x\\ny" or the first
newline of "x\\n\\ny" (x, y not whitespace): WordPiece and SentencePiece treat newlines as
spaces, and byte-level BPE (GPT-2) makes each of these newlines a token of its own, so at such
a cut the ids are those of tokenizing the whole text in one call.  Where a
model has no tokenizer (a hub id at random init, offline), the inputs are
token ids drawn uniformly from the vocabulary with the seed, and the result
records that.  Every sequence is full, so the mask is all ones; metrics still
take the mask, so padded batches give the values of their unpadded parts.
"""

from __future__ import annotations

import hashlib
import re
import stat
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import torch

from probe.errors import ProbeError
from probe.requests import checks

SAMPLE = "probe sample text"
PIECE_CHARS = 1 << 16  # characters per piece of text handed to the tokenizer
PIECES_PER_CALL = 16  # pieces per batched tokenizer call
_BOUNDARY = re.compile(r"\S\n(?=\n?\S)")


def text_pieces(body: str, size: int = PIECE_CHARS) -> list[str]:
    """``body`` cut into pieces of about ``size`` characters at the boundaries named above."""
    pieces, start = [], 0
    while start < len(body):
        found = _BOUNDARY.search(body, start + size) if start + size < len(body) else None
        stop = len(body) if found is None else found.start() + 2
        pieces.append(body[start:stop])
        start = stop
    return pieces


def tokenize(tokenizer, body: str, needed: int | None = None) -> list[int]:
    """Token ids of ``body`` (no special tokens), in batched calls, stopping once ``needed``."""
    pieces, ids = text_pieces(body, PIECE_CHARS), []
    for first in range(0, len(pieces), PIECES_PER_CALL):
        batch = pieces[first : first + PIECES_PER_CALL]
        for piece_ids in tokenizer(batch, add_special_tokens=False, verbose=False)["input_ids"]:
            ids.extend(piece_ids)
        if needed is not None and len(ids) >= needed:
            break
    return ids


@dataclass(frozen=True)
class Encoded:
    """The inputs as the model reads them: what an [`Inputs`][probe.requests.request.Inputs] asked
    for, tokenized or read (`probe.requests.inputs.model_inputs`).

    `batches(size)` cuts them into consecutive batches of (first sequence, ids, mask).

    Parameters
    ----------
    input_ids
        Token ids (sequence, token) int64, or an image family's pixels (sequence, channel,
        height, width).
    attention_mask
        (sequence, token) int64, 1 at real tokens.
    kind
        How they were made: `"tokenizer"`, `"synthetic ids"`, `"images"`, `"noise
        images"`, or the ids or pixels passed by the caller.
    text_source
        Where the text, images or ids came from, in words.
    text_sha256
        The SHA-256 of what was read (the text, the image files, the ids or pixels
        passed); empty for synthetic ids and noise images.
    """

    #: Token ids (sequence, token) int64, or an image family's pixels (sequence, channel, h, w).
    input_ids: torch.Tensor
    attention_mask: torch.Tensor  # (sequence, token) int64, 1 = real token
    kind: str  # "tokenizer", "synthetic ids", "images" or "noise images"
    text_source: str
    text_sha256: str

    @property
    def sequences(self) -> int:
        return self.input_ids.shape[0]

    @property
    def tokens(self) -> int:
        return self.attention_mask.shape[1]

    def token_ids(self):
        """The token ids as they run, a (sequence, token) int64 array with -1 at padding, for
        a result to keep; None for an image family's pixels."""
        import numpy as np

        if self.input_ids.dim() != 2:
            return None
        real = self.attention_mask.bool().numpy()
        return np.where(real, self.input_ids.numpy(), -1).astype(np.int64)

    def batches(self, size: int) -> list[tuple[int, torch.Tensor, torch.Tensor]]:
        """(first sequence, ids, mask) for consecutive batches of at most ``size`` sequences."""
        return [
            (start, self.input_ids[start : start + size], self.attention_mask[start : start + size])
            for start in range(0, self.sequences, size)
        ]


def sample_text() -> str:
    return (resources.files("probe") / "data" / "sample.txt").read_text(encoding="utf-8")


def read_text(path: str | Path | None) -> tuple[str, str]:
    """(text, a description of where it came from); ``None`` is the sample text."""
    if path is None:
        return sample_text(), SAMPLE
    path = checks.readable_file(path, "`text`", "text file")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ProbeError(
            f"{path} is not UTF-8 text; convert it, e.g. with iconv -t utf-8"
        ) from None
    if not text.strip():
        raise ProbeError(f"{path} is empty; give a text with at least one sequence of tokens")
    return text, str(path)


def make_inputs(
    tokenizer,
    vocab_size: int,
    *,
    text: str | Path | None = None,
    sequences: int | str = 32,
    tokens: int = 128,
    seed: int = 0,
    warn=None,
) -> Encoded:
    """Token ids (sequence, token) from a text, or seeded synthetic ids without a tokenizer.

    ``sequences="all"`` takes every full sequence of the text (it needs a tokenizer).
    """
    every = sequences == "all"
    if every:
        if tokenizer is None:
            raise ProbeError(
                "`sequences` all needs a text and the model's tokenizer; give a number instead"
            )
        sequences = 1
    elif not isinstance(sequences, int):
        raise ProbeError(f"`sequences` must be a number or 'all', got {sequences!r}")
    if sequences < 1 or tokens < 2:
        raise ProbeError("need `sequences` >= 1 and `tokens` >= 2 (the metrics compare tokens)")
    if tokenizer is None:
        if text is not None:
            raise ProbeError(
                "`text` needs the model's tokenizer, and none could be loaded; "
                "use a local folder with tokenizer files, or drop `text` for synthetic ids"
            )
        generator = torch.Generator().manual_seed(seed)
        ids = torch.randint(0, vocab_size, (sequences, tokens), generator=generator)
        return Encoded(
            ids, torch.ones_like(ids), "synthetic ids", f"uniform token ids, seed {seed}", ""
        )

    body, source = read_text(text)
    ids = tokenize(tokenizer, body, None if every else sequences * tokens)
    available = len(ids) // tokens
    if available == 0:
        raise ProbeError(
            f"{source} has {len(ids)} tokens, fewer than one sequence of {tokens}; "
            "use a longer text or a smaller `tokens`"
        )
    if every:
        sequences = available
    elif available < sequences:
        if warn is not None:
            warn(
                f"{source} has {len(ids)} tokens: {available} sequences of {tokens} possible, "
                f"using {available} instead of {sequences}"
            )
        sequences = available
    chunk = torch.tensor(ids[: sequences * tokens], dtype=torch.long).view(sequences, tokens)
    if int(chunk.max()) >= vocab_size:
        raise ProbeError(
            f"the tokenizer gives ids up to {int(chunk.max())} but the model has {vocab_size} embeddings; "
            "the tokenizer does not belong to this model"
        )
    digest = hashlib.sha256(body.encode("utf-8")).hexdigest()
    return Encoded(chunk, torch.ones_like(chunk), "tokenizer", source, digest)


IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm")


def image_tokens(config) -> int:
    """Tokens a ViT makes of one image: its patches and the [CLS] token."""
    return (config.image_size // config.patch_size) ** 2 + 1


def make_image_inputs(
    config,
    processor,
    *,
    images: str | Path | None = None,
    sequences: int | str = 32,
    seed: int = 0,
    warn=None,
) -> Encoded:
    """Pixels (image, channel, h, w) for an image family, through the model's image processor.

    ``images``: a folder of image files, taken in name order (``sequences="all"``: every
    one); without it, ``sequences`` images of uniform noise drawn with ``seed``.  Every
    image gives the same number of tokens (patches + [CLS]), so the mask is all ones.
    """
    size = config.image_size
    channels = image_channels(config, processor)
    if images is None:
        if sequences == "all":
            raise ProbeError("`sequences` all needs `images` DIR; give a number instead")
        if not isinstance(sequences, int) or sequences < 1:
            raise ProbeError(f"`sequences` must be a positive number or 'all', got {sequences!r}")
        import numpy as np

        rng = np.random.default_rng(seed)
        noise = rng.integers(0, 256, (sequences, size, size, config.num_channels), dtype=np.uint8)
        pixels = processor(images=list(noise), return_tensors="pt")["pixel_values"]
        kind, source, digest = "noise images", f"uniform noise images, seed {seed}", ""
    else:
        files = image_files(images)
        if sequences != "all":
            files = files[:sequences]
        opened = [
            _open_image(f, channels) for f in files
        ]  # a broken file stops the run before any word
        if sequences != "all" and len(files) < sequences and warn is not None:
            warn(f"{images} has {len(files)} images, using {len(files)} instead of {sequences}")
        pixels = processor(images=opened, return_tensors="pt")["pixel_values"]
        hasher = hashlib.sha256()
        for f in files:
            hasher.update(f.read_bytes())
        kind, source, digest = "images", str(images), hasher.hexdigest()
    mask = torch.ones(pixels.shape[0], image_tokens(config), dtype=torch.long)
    return Encoded(pixels, mask, kind, source, digest)


def image_files(folder: str | Path) -> list[Path]:
    """The image files of ```images` DIR``, in name order; a clear error for anything else."""
    folder = checks.as_path(folder, "`images`", "folder of image files")
    info = checks.path_state(folder, "`images`")
    if info is None or not stat.S_ISDIR(info.st_mode):
        raise ProbeError(f"`images` {folder} is not a folder; give a folder of image files")
    checks.readable_folder(folder, "`images`", "folder of image files")
    files = sorted(f for f in folder.iterdir() if f.suffix.lower() in IMAGE_SUFFIXES)
    if not files:
        raise ProbeError(
            f"`images` {folder} holds no image files ({', '.join(IMAGE_SUFFIXES)}); "
            "give a folder of images"
        )
    return files


#: Integer and float modes, read by their range (8-bit modes are PIL's own conversions).
_WIDE_MODES = {"I;16": 65535, "I;16L": 65535, "I;16B": 65535, "I;16N": 65535, "I": 65535, "F": 1}
#: Modes PIL converts to RGB with their 8-bit range kept (CMYK and YCbCr by its formulas).
_COLOUR_MODES = ("RGB", "RGBX", "CMYK", "YCbCr", "LAB", "HSV")


def image_channels(config, processor) -> int:
    """The channels the model reads: 1 (gray) or 3 (RGB), matched by its image processor."""
    channels = config.num_channels
    if channels not in (1, 3):
        raise ProbeError(
            f"the model reads {channels} channels (config num_channels); probe reads image "
            "files as gray (1) or RGB (3): pass such pixels from Python as probe.Inputs(ids=...)"
        )
    for name in ("image_mean", "image_std"):
        value = getattr(processor, name, None)
        if isinstance(value, list | tuple) and len(value) != channels:
            raise ProbeError(
                f"the model reads {channels} channels but its image processor's {name} has "
                f"{len(value)}; fix preprocessor_config.json"
            )
    return channels


def _open_image(path: Path, channels: int = 3):
    """The image at ``path`` as 8-bit gray (``channels`` 1) or RGB (3), read as what it is.

    16-bit and 32-bit integer pixels are scaled from 0..65535, float pixels from 0..1 (values
    outside those ranges are refused, not clipped); palettes are expanded; an alpha channel
    is dropped where every pixel is opaque and refused otherwise (no background to guess).
    An image over PIL's pixel limit (a possible decompression bomb) is refused unread."""
    import warnings

    from PIL import Image, UnidentifiedImageError

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(path) as image:
                return _eight_bit(image, path).convert("L" if channels == 1 else "RGB")
    except ProbeError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise ProbeError(
            f"{path} has more pixels than PIL reads safely ({Image.MAX_IMAGE_PIXELS:,}; a "
            "possible decompression bomb); shrink it or remove it from `images`"
        ) from None
    except (OSError, UnidentifiedImageError, ValueError) as err:
        raise ProbeError(f"cannot read the image {path}: {err}; remove it from `images`") from None


def _eight_bit(image, path: Path):
    """``image`` in an 8-bit mode (L, LA, RGB, RGBA), its range scaled, its alpha checked."""
    import numpy as np
    from PIL import Image

    mode = image.mode
    if mode in ("P", "PA"):
        has_alpha = mode == "PA" or "transparency" in image.info
        image = image.convert("RGBA" if has_alpha else "RGB")
    elif mode == "1":
        image = image.convert("L")
    elif mode in _WIDE_MODES:
        pixels = np.asarray(image, dtype=np.float64)
        top = _WIDE_MODES[mode]
        if not np.isfinite(pixels).all() or pixels.min() < 0 or pixels.max() > top:
            raise ProbeError(
                f"{path} has {mode} pixels from {pixels.min():g} to {pixels.max():g}, outside "
                f"0..{top}; probe reads {'float pixels in 0..1' if top == 1 else 'up to 16 bits'}"
            )
        image = Image.fromarray(np.rint(pixels * (255 / top)).astype(np.uint8), "L")
    elif mode in ("La", "RGBa"):  # premultiplied alpha
        image = image.convert(mode.upper())
    if image.mode in ("LA", "RGBA"):
        low, _ = image.getchannel("A").getextrema()
        if low < 255:
            raise ProbeError(
                f"{path} has transparent pixels; the model reads no alpha channel: flatten it "
                "onto a background first, or remove it from `images`"
            )
        return image.convert(image.mode[:-1])
    if image.mode in _COLOUR_MODES:
        return image.convert("RGB") if image.mode != "RGB" else image
    if image.mode != "L":
        raise ProbeError(f"{path} has PIL mode {image.mode}, which probe cannot read as an image")
    return image


def check_input_kind(probed, text, images) -> None:
    """`text` for a text model, `images` for an image model; a clear line otherwise."""
    if probed.adapter.inputs == "pixels" and text is not None:
        raise ProbeError(f"{probed.name} reads images, not text; use `images` DIR")
    if probed.adapter.inputs != "pixels" and images is not None:
        raise ProbeError(f"{probed.name} reads text, not images; use `text` FILE")


def model_inputs(probed, given, *, seed: int = 0, warn=None) -> Encoded:
    """The inputs a probed model reads (``given``: a :class:`probe.requests.request.Inputs`): token
    ids from a text, images, or the ids or pixels the caller passed (see above)."""
    check_input_kind(probed, given.text, given.images)
    if given.ids is not None:
        return passed_inputs(probed, given.ids)
    if probed.adapter.inputs == "pixels":
        return make_image_inputs(
            probed.config,
            probed.image_processor,
            images=given.images,
            sequences=given.sequences,
            seed=seed,
            warn=warn,
        )
    return make_inputs(
        probed.tokenizer,
        probed.config.vocab_size,
        text=given.text,
        sequences=given.sequences,
        tokens=given.tokens,
        seed=seed,
        warn=warn,
    )


def passed_inputs(probed, ids: torch.Tensor) -> Encoded:
    """Token ids (sequence, token) or an image model's pixels (sequence, channel, h, w) that
    the caller holds, used as they are; every token is real."""
    config = probed.config
    if probed.adapter.inputs == "pixels":
        shape = (config.num_channels, config.image_size, config.image_size)
        if ids.dim() != 4 or tuple(ids.shape[1:]) != shape:
            raise ProbeError(
                f"{probed.name} reads pixels of shape (sequence, {', '.join(map(str, shape))}); "
                f"`ids` has shape {tuple(ids.shape)}"
            )
        tokens = (config.image_size // config.patch_size) ** 2 + 1  # the patches and [CLS]
        pixels = ids.detach().to(dtype=probed.dtype, device="cpu")
        mask = torch.ones(ids.shape[0], tokens, dtype=torch.long)
        digest = hashlib.sha256(pixels.float().numpy().tobytes()).hexdigest()
        return Encoded(
            pixels, mask, "pixels passed by the caller", "pixels passed by the caller", digest
        )
    if ids.dim() != 2 or ids.dtype.is_floating_point or ids.dtype == torch.bool:
        raise ProbeError(
            f"`ids` must be integer token ids of shape (sequence, token); got {ids.dtype} "
            f"of shape {tuple(ids.shape)}"
        )
    vocab = config.vocab_size
    if int(ids.min()) < 0 or int(ids.max()) >= vocab:
        raise ProbeError(f"`ids` must lie in [0, {vocab}) for {probed.name}'s vocabulary")
    chunk = ids.detach().to(dtype=torch.long, device="cpu")
    digest = hashlib.sha256(chunk.numpy().tobytes()).hexdigest()
    return Encoded(
        chunk,
        torch.ones_like(chunk),
        "ids passed by the caller",
        "ids passed by the caller",
        digest,
    )


def given_ids(ids, sequences, tokens) -> tuple[torch.Tensor, int, int | None]:
    """``Inputs(ids=...)``: the tensor (:func:`tensor_of`), and the sequences and tokens its
    shape gives (a (sequence, token) tensor of ids, or (sequence, channel, height, width)
    pixels, whose tokens are the model's); sizes given beside it must be those."""
    ids = tensor_of(ids)
    shape = tuple(ids.shape)
    if len(shape) not in (2, 4) or 0 in shape:
        raise ProbeError(
            "`ids` must be a (sequence, token) tensor of token ids or a (sequence, "
            f"channel, height, width) tensor of pixels; got shape {shape}"
        )
    if sequences not in (None, shape[0]) or (len(shape) == 2 and tokens not in (None, shape[1])):
        raise ProbeError("`sequences` and `tokens` come from the shape of `ids`; drop them")
    return ids, shape[0], shape[1] if len(shape) == 2 else tokens


def tensor_of(ids):
    """``ids`` as a torch tensor: a tensor as it is; a numpy array or nested lists of whole
    numbers (token ids) or of reals (pixels) as the tensor they hold, copied (int64, or
    their float dtype); anything else refused in one line."""
    import numpy as np

    if isinstance(ids, torch.Tensor):
        return ids
    try:
        array = np.asarray(ids)
    except (ValueError, TypeError):  # ragged lists
        array = None
    if array is None or array.dtype.kind not in "iuf":
        raise ProbeError(
            "`ids` must be a tensor (or a numpy array) of token ids or of pixels; got "
            f"{type(ids).__name__}"
            + (f" of {array.dtype}" if array is not None and array.dtype != object else "")
        )
    if array.dtype.kind in "iu":
        return torch.from_numpy(array.astype(np.int64))
    return torch.from_numpy(array.copy())
