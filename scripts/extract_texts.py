#!/usr/bin/env python3
"""Turns the Debian packages that scripts/fetch_test_data.sh unpacked into plain-text files.

    extract_texts.py austen  PKG_ROOT OUTDIR   six Jane Austen novels from r-cran-janeaustenr
    extract_texts.py pydocs  PKG_ROOT OUT.txt  the Python 3.11 documentation sources
    extract_texts.py jargon  PKG_ROOT OUT.txt  the Jargon File

PKG_ROOT is the directory a package was unpacked into with `dpkg -x`. Only the standard library
is used (no R): r-cran-janeaustenr keeps its data as an R lazy-load database, which this file
reads itself (see `read_lazyload_db`).

Prints what it writes, with sizes in characters, on stderr.
"""

import glob
import gzip
import html.parser
import os
import struct
import sys
import zlib


def log(msg):
    print(f"[extract_texts] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------
# R serialization (the XDR "X\n" format, versions 2 and 3), enough for data objects:
# character/logical/integer/double vectors, lists, pairlists, symbols and attributes.
# Reference: R's src/main/serialize.c.

NILSXP, SYMSXP, LISTSXP, CLOSXP, ENVSXP, PROMSXP, LANGSXP = 0, 1, 2, 3, 4, 5, 6
CHARSXP, LGLSXP, INTSXP, REALSXP, CPLXSXP, STRSXP, VECSXP, EXPRSXP, RAWSXP = 9, 10, 13, 14, 15, 16, 19, 20, 24
REFSXP, NILVALUE_SXP, GLOBALENV_SXP, UNBOUNDVALUE_SXP, MISSINGARG_SXP, BASENAMESPACE_SXP = 255, 254, 253, 252, 251, 250
EMPTYENV_SXP, BASEENV_SXP, ALTREP_SXP = 242, 241, 238
IS_OBJECT_BIT, HAS_ATTR_BIT, HAS_TAG_BIT = 1 << 8, 1 << 9, 1 << 10
NA_INTEGER = -(2**31)
UTF8_MASK, LATIN1_MASK, BYTES_MASK, ASCII_MASK = 1 << 3, 1 << 2, 1 << 1, 1 << 6


class RObject:
    """A vector or list with R attributes (`attrs` maps attribute name to value)."""

    def __init__(self, kind, value, attrs=None):
        self.kind, self.value, self.attrs = kind, value, attrs or {}

    def __repr__(self):
        return f"RObject({self.kind}, {self.value!r:.80}, attrs={list(self.attrs)})"


class RSymbol(str):
    pass


class _Reader:
    def __init__(self, data):
        self.data, self.pos, self.refs = data, 0, []
        self.native_encoding = "utf-8"

    def raw(self, n):
        if self.pos + n > len(self.data):
            raise ValueError("truncated R serialization stream")
        b = self.data[self.pos : self.pos + n]
        self.pos += n
        return b

    def int(self):
        return struct.unpack(">i", self.raw(4))[0]

    def header(self):
        fmt = self.raw(2)
        if fmt != b"X\n":
            raise ValueError(f"not an XDR R serialization (format {fmt!r}); only 'X\\n' is supported")
        version = self.int()
        self.int()  # R version that wrote it
        self.int()  # minimal R version to read it
        if version == 3:
            n = self.int()
            self.native_encoding = self.raw(n).decode("ascii").lower()
        elif version != 2:
            raise ValueError(f"unsupported R serialization version {version}")

    def charsxp(self, levels):
        n = self.int()
        if n == -1:
            return None  # NA_character_
        b = self.raw(n)
        if levels & LATIN1_MASK:
            return b.decode("latin-1")
        if levels & (UTF8_MASK | ASCII_MASK):
            return b.decode("utf-8")
        if levels & BYTES_MASK:
            return b.decode("latin-1")
        return b.decode(self.native_encoding, errors="replace")

    def attributes(self, flags):
        if not flags & HAS_ATTR_BIT:
            return {}
        pl = self.item()
        return dict(pl) if isinstance(pl, list) else {}

    def item(self):
        flags = self.int()
        t = flags & 0xFF
        levels = flags >> 12
        if t == NILVALUE_SXP:
            return None
        if t in (EMPTYENV_SXP, BASEENV_SXP, GLOBALENV_SXP, UNBOUNDVALUE_SXP, MISSINGARG_SXP, BASENAMESPACE_SXP):
            return RObject("special", t)
        if t == REFSXP:
            idx = flags >> 8
            if idx == 0:
                idx = self.int()
            return self.refs[idx - 1]
        if t == SYMSXP:
            sym = RSymbol(self.item() or "")  # a CHARSXP follows
            self.refs.append(sym)
            return sym
        if t in (LISTSXP, LANGSXP):
            # A pairlist, returned as [(tag, value), ...]; walked iteratively (the CDR chain can be long).
            out, first_attrs = [], None
            while True:
                attrs = self.attributes(flags)
                if first_attrs is None:
                    first_attrs = attrs
                tag = self.item() if flags & HAS_TAG_BIT else None
                out.append((tag, self.item()))
                flags = self.int()
                t = flags & 0xFF
                if t == NILVALUE_SXP:
                    break
                if t not in (LISTSXP, LANGSXP):
                    # Improper list: the tail is another object. Rewind and read it as one.
                    self.pos -= 4
                    out.append((None, self.item()))
                    break
            return out
        if t == CHARSXP:
            return self.charsxp(levels)
        if t in (LGLSXP, INTSXP):
            n = self.length()
            vals = list(struct.unpack(f">{n}i", self.raw(4 * n)))
            vals = [None if v == NA_INTEGER else (bool(v) if t == LGLSXP else v) for v in vals]
            return RObject("logical" if t == LGLSXP else "integer", vals, self.attributes(flags))
        if t == REALSXP:
            n = self.length()
            vals = list(struct.unpack(f">{n}d", self.raw(8 * n)))
            return RObject("double", vals, self.attributes(flags))
        if t == CPLXSXP:
            n = self.length()
            vals = struct.unpack(f">{2 * n}d", self.raw(16 * n))
            values = [complex(a, b) for a, b in zip(vals[::2], vals[1::2], strict=True)]
            return RObject("complex", values, self.attributes(flags))
        if t == RAWSXP:
            n = self.length()
            return RObject("raw", self.raw(n), self.attributes(flags))
        if t == STRSXP:
            n = self.length()
            vals = []
            for _ in range(n):
                f = self.int()
                if f & 0xFF != CHARSXP:
                    raise ValueError(f"STRSXP element of type {f & 0xFF}")
                vals.append(self.charsxp(f >> 12))
            return RObject("character", vals, self.attributes(flags))
        if t in (VECSXP, EXPRSXP):
            n = self.length()
            vals = [self.item() for _ in range(n)]
            return RObject("list", vals, self.attributes(flags))
        if t == ALTREP_SXP:
            info = self.item()
            state = self.item()
            attrs = self.item()
            cls = str(info[0][1]) if isinstance(info, list) and info else "?"
            if cls == "compact_intseq" and isinstance(state, RObject):
                n, start, step = (int(x) for x in state.value)
                return RObject("integer", list(range(start, start + n * step, step)), dict(attrs or []))
            if cls == "compact_realseq" and isinstance(state, RObject):
                n, start, step = state.value
                return RObject("double", [start + i * step for i in range(int(n))], dict(attrs or []))
            if cls in ("wrap_string", "wrap_integer", "wrap_real", "wrap_logical", "wrap_list"):
                return state[0][1] if isinstance(state, list) else state
            raise ValueError(f"unsupported ALTREP class {cls}")
        raise ValueError(f"unsupported R SEXP type {t} at offset {self.pos - 4}")

    def length(self):
        n = self.int()
        if n == -1:  # long vector
            hi, lo = self.int(), self.int()
            n = (hi << 32) + lo
        return n


def unserialize(data):
    r = _Reader(data)
    r.header()
    return r.item()


def read_lazyload_db(base):
    """Reads an R lazy-load database, the pair `base.rdx` / `base.rdb`, into {name: object}.

    `.rdx` is a gzip'd serialized list(variables = named list of c(offset, length), references,
    compressed). Each `.rdb` record at [offset, offset+length) is a 4-byte big-endian uncompressed
    length followed by a zlib stream (compressed = TRUE/1); the stream holds one serialized object.
    """
    with open(base + ".rdx", "rb") as f:
        raw = f.read()
    index = unserialize(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else zlib.decompress(raw[4:]))
    fields = dict(zip(index.attrs["names"].value, index.value, strict=True))
    compressed = fields.get("compressed")
    if compressed is not None and compressed.value[0] not in (True, 1):
        raise ValueError(f"{base}.rdb uses compression type {compressed.value[0]}; only zlib is supported")
    variables = fields["variables"]
    with open(base + ".rdb", "rb") as f:
        rdb = f.read()
    out = {}
    for name, loc in zip(variables.attrs["names"].value, variables.value, strict=True):
        off, length = (int(x) for x in loc.value)
        rec = rdb[off : off + length]
        size = struct.unpack(">I", rec[:4])[0]
        payload = zlib.decompress(rec[4:])
        if len(payload) != size:
            raise ValueError(f"{name}: decompressed {len(payload)} bytes, header says {size}")
        out[name] = unserialize(payload)
    return out


# --------------------------------------------------------------------------------------------

AUSTEN_NOVELS = ["emma", "mansfieldpark", "northangerabbey", "persuasion", "prideprejudice", "sensesensibility"]


def write_text(path, text):
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8", newline="\n") as f:
        f.write(text)
    os.replace(tmp, path)
    log(f"wrote {path}: {len(text):,} characters")


def austen(pkg_root, outdir):
    bases = glob.glob(os.path.join(pkg_root, "usr/lib/R/site-library/janeaustenr/data/Rdata.rdx"))
    if not bases:
        raise SystemExit(f"janeaustenr data (Rdata.rdx) not found under {pkg_root}")
    objects = read_lazyload_db(bases[0][: -len(".rdx")])
    os.makedirs(outdir, exist_ok=True)
    for name in AUSTEN_NOVELS:
        obj = objects.get(name)
        if not isinstance(obj, RObject) or obj.kind != "character":
            raise SystemExit(f"janeaustenr: object {name!r} missing or not a character vector")
        lines = ["" if s is None else s for s in obj.value]
        write_text(os.path.join(outdir, name + ".txt"), "\n".join(lines) + "\n")


class _TextOnly(html.parser.HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.parts, self.skip = [], 0

    def handle_starttag(self, tag, attrs):
        if tag in ("script", "style"):
            self.skip += 1

    def handle_endtag(self, tag):
        if tag in ("script", "style") and self.skip:
            self.skip -= 1
        elif tag in ("p", "div", "pre", "li", "h1", "h2", "h3", "h4", "dt", "dd", "tr", "br"):
            self.parts.append("\n")

    def handle_data(self, data):
        if not self.skip:
            self.parts.append(data)


def strip_html(text):
    p = _TextOnly()
    p.feed(text)
    p.close()
    return "".join(p.parts)


def pydocs(pkg_root, out):
    docs = sorted(glob.glob(os.path.join(pkg_root, "usr/share/doc/python3*/html")), key=os.path.islink)
    if not docs:
        raise SystemExit(f"python docs not found under {pkg_root}")
    src = os.path.join(docs[0], "_sources")
    files = []
    if os.path.isdir(src):
        for dirpath, _, names in os.walk(src):
            files += [os.path.join(dirpath, n) for n in names if n.endswith((".rst.txt", ".txt", ".rst"))]
        root, html_mode = src, False
    else:  # only HTML: strip the tags
        for dirpath, _, names in os.walk(docs[0]):
            files += [os.path.join(dirpath, n) for n in names if n.endswith(".html")]
        root, html_mode = docs[0], True
    if not files:
        raise SystemExit(f"no documentation sources under {docs[0]}")
    parts = []
    for path in sorted(files, key=lambda p: os.path.relpath(p, root)):
        with open(path, encoding="utf-8", errors="replace") as f:
            body = f.read()
        if html_mode:
            body = strip_html(body)
        parts.append(f"==> {os.path.relpath(path, root)} <==\n\n{body.rstrip()}\n\n")
    log(f"python docs: {len(files)} files from {root}")
    write_text(out, "".join(parts))


def jargon(pkg_root, out):
    d = os.path.join(pkg_root, "usr/share/doc/jargon-text")
    gz, txt, htm = (os.path.join(d, n) for n in ("jargon.txt.gz", "jargon.txt", "jargon.html"))
    if os.path.exists(gz):
        text = gzip.decompress(open(gz, "rb").read()).decode("utf-8")
    elif os.path.exists(txt):
        text = open(txt, encoding="utf-8").read()
    else:
        raise SystemExit(f"jargon.txt(.gz) not found under {d}")
    write_text(out, text)


def main(argv):
    if len(argv) != 4 or argv[1] not in ("austen", "pydocs", "jargon"):
        print(__doc__, file=sys.stderr)
        return 2
    {"austen": austen, "pydocs": pydocs, "jargon": jargon}[argv[1]](argv[2], argv[3])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
