"""Reference token ids from Hugging Face `tokenizers`, for oomb's tokenizer parity test.

Usage: tokenizer_reference.py --data-dir DATA --out-dir OUT [--smollm2 DIR]

Writes into OUT:
  corpus.jsonl                  {"text": ...} per line: hand-written edge cases (multilingual,
                                code, whitespace runs, CRLF, emoji ZWJ sequences, combining marks,
                                inline special tokens, digit runs), seeded random strings, and
                                slices of the Austen texts, python-docs, the KJV bible and the
                                jargon file (two ~100 KB slices among them)
  qwen2/tokenizer.json          a byte-level BPE trained here with Qwen2's tokenizer.json layout:
                                NFC normalizer, Split(Qwen2 regex, Isolated) + ByteLevel(no
                                regex), ChatML special tokens, merges written as "a b" strings
  llama3/tokenizer.json         the same with Llama-3's regex (\\p{N}{1,3}), ignore_merges, a
                                <|begin_of_text|> TemplateProcessing post-processor, and added
                                tokens using lstrip / rstrip / single_word / normalized
  o200k/tokenizer.json          a byte-level BPE trained here with Phi-4-mini's tokenizer.json layout
                                (o200k_base's pattern: case classes \\p{Lu} \\p{Lt} \\p{Lm} \\p{Lo}
                                \\p{M} \\p{Ll}, contractions after a word, \\p{N}{1,3}; no normalizer)
                                and its chat special tokens
  llama2/tokenizer.json         a SentencePiece-style BPE (byte_fallback, <0xXX> tokens, unk) trained
                                here with Llama-2's / Mistral's layout: Prepend + Replace normalizers,
                                no pre-tokenizer, a <s> template, decoders Replace, ByteFallback,
                                Fuse, Strip
  <name>.expected.jsonl         per corpus line: {"ids": encode(text, add_special_tokens=False).ids,
                                "ids_special": encode(text, add_special_tokens=True).ids,
                                "decoded": decode(ids)} for name in smollm2, qwen2, llama3, o200k, llama2,
                                and gemma3 (Gemma-3-270M's tokenizer.json) when the model is present
"""
import argparse
import json
import os
import random
import sys

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from tokenizers.processors import ByteLevel as ByteLevelProcessor
from tokenizers.processors import Sequence as ProcessorSequence
from tokenizers.processors import TemplateProcessing

QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")

EDGE_CASES = [
    "", " ", "  ", "\n", "\t", "a", "Hello, world!", "Hello world", " Hello world ", "hello   world",
    "The quick brown fox jumps over the lazy dog. THE QUICK BROWN FOX!",
    "I'm sure it's fine; they'll say we've done what I'd do. DON'T SHOUT, I'LL HEAR. It’s curly.",
    "ſ's Kelvin 'S 'T 'RE", "x'y 'll' ''", "can't won't shan't y'all",
    "line one\nline two\n\nline four\r\nwindows\r\n\r\nend\r", "\r\n\r\n", "\n\n\n   \n\t\t\n",
    "tabs\tbetween\twords\t\t\tand trailing spaces   ", "    indented code", "a  b   c    d     e",
    "trailing newline\n", "   leading spaces", "\u00a0non-breaking\u00a0space\u3000ideographic\u2003em\u2009thin",
    "next\u0085line and \u2028 line sep \u2029 para sep", "zero\u200bwidth\u200cnon\u200djoiner",
    "1234567890", "3.14159265358979", "x = 12345 + 678; y=0x1F", "phone: +1 (555) 010-9999", "1,000,000.00",
    "٣٤٥ Arabic-Indic digits, ①②③ circled, Ⅻ roman, ½ ¾ fractions, ２０２４ fullwidth",
    "日本語のテキストです。東京は大きい都市です。", "中文文本，包括标点符号！还有数字123。",
    "한국어 텍스트입니다. 안녕하세요!",
    "العربية نص مع علامات: مرحبا بالعالم.", "Русский текст: съешь же ещё этих мягких французских булок.",
    "Ελληνικά: Ξεσκεπάζω την ψυχοφθόρα βδελυγμία.", "עברית: שלום עולם", "हिन्दी पाठ: नमस्ते दुनिया", "ภาษาไทย สวัสดี",
    "Accents: café naïve résumé Ångström Zürich façade jalapeño coöperate",
    "Combining: cafe\u0301 nai\u0308ve A\u030angstro\u0308m e\u0301\u0301 q\u0307\u0323 \u0301lead",
    "Hangul jamo: \u1100\u1161\u11a8 \u1112\u1161\u11ab and precomposed 각 한",
    "Singletons: \u212b \u2126 \u212a; compat stays: ﬁ ² ｶ",
    "Emoji: 😀 😃 👍🏽 🇫🇷 ❤️ 👨‍👩‍👧‍👦 🧑🏻‍💻 🏳️‍🌈 ✊🏿 1️⃣ #️⃣",
    "Math: ∀x∈ℝ, ∃y: x²+y²≤1 ⇒ ∑ᵢ aᵢ ≈ ∫ f(x)dx ≠ ∞",
    "Symbols: © ® ™ § ¶ † ‡ • … ‰ ′ ″ ‹ › « » “ ” ‘ ’ ¿ ¡ — –",
    "def f(x):\n    return x ** 2  # square\n\nclass A:\n\tpass\n",
    "for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }\n",
    "fn main() {\n    println!(\"Hello, {}!\", name);\n}\n",
    "<html><body><div class=\"x\">Hi&nbsp;there</div></body></html>",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name DESC;",
    "{\"key\": [1, 2, 3], \"nested\": {\"a\": null, \"b\": true}}",
    "https://example.com/path?query=1&x=y#frag user@example.org",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n",
    "text<|endoftext|>more text", "<|im_start|><|im_end|><|endoftext|>", "<|im_start", "im_end|>", "<|im_end|",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>",
    "a <|mask|> b", "a<|mask|>b", "a   <|mask|>   b", "zzword zzwords xzzword zzword. (zzword)", "xyzzy and XYZZY",
    "!!!???...,,,;;;:::", "----====____****", "$$$ %%% ^^^ &&& ~~~ ```", "🙂" * 10, "a" * 300, " " * 50, "\n" * 20,
    "ab" * 100, "1" * 50, "word " * 40,
]


def random_strings(n, seed=1234):
    rng = random.Random(seed)
    pool = ("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 \t\n\r.,;:!?'\"()[]{}<>-_=+*/\\|@#$%^&~`"
            "éèêëàâäôöûüçñßøåæœÉÀÇ" "日本語中文한국어" "абвгдеёжзийклмнопрстуфхцчшщъыьэюя" "αβγδεζηθ" "ابتثجحخ"
            "\u0301\u0308\u0327\u0323\u00a0\u3000\u2028\u0085\u200d" "😀👍🏽❤️🇫🇷" "①½²٣")
    specials = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|mask|>"]
    out = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randint(1, 40)):
            r = rng.random()
            if r < 0.03:
                parts.append(rng.choice(specials))
            elif r < 0.2:
                parts.append(" " * rng.randint(1, 5))
            else:
                parts.append("".join(rng.choice(pool) for _ in range(rng.randint(1, 8))))
        out.append("".join(parts))
    return out


# OpenAI's o200k_base split, which Phi-4-mini's tokenizer.json carries.
O200K_PATTERN = "|".join([
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"\p{N}{1,3}",
    r" ?[^\s\p{L}\p{N}]+[\r\n/]*",
    r"\s*[\r\n]+",
    r"\s+(?!\S)",
    r"\s+",
])


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def build_corpus(data_dir):
    texts = list(EDGE_CASES) + random_strings(400)
    tdir = os.path.join(data_dir, "texts")
    austen = sorted(os.listdir(os.path.join(tdir, "austen")))
    for name in austen:
        paras = [p for p in read(os.path.join(tdir, "austen", name)).split("\n\n") if p.strip()]
        texts += paras[200:260]  # 60 paragraphs from the middle of each novel
    pride = read(os.path.join(tdir, "austen", "prideprejudice.txt"))
    texts.append(pride[50_000:150_000])  # a ~100 KB slice
    docs = read(os.path.join(tdir, "python-docs.txt"))
    texts.append(docs[1_000_000:1_100_000])  # a ~100 KB slice of code and prose
    for k in range(40):
        texts.append(docs[2_000_000 + k * 5000:2_000_000 + k * 5000 + 2000])
    bible = read(os.path.join(tdir, "bible-kjv.txt"))
    texts += [bible[200_000 + k * 3000:200_000 + k * 3000 + 1500] for k in range(20)]
    jargon = read(os.path.join(tdir, "jargon.txt"))
    texts += [jargon[300_000 + k * 3000:300_000 + k * 3000 + 1500] for k in range(20)]
    return texts, pride[:600_000] + docs[:600_000]


def train(training_text, pattern, specials, vocab_size=4000):
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    chunks = [training_text[i:i + 2000] for i in range(0, len(training_text), 2000)]
    tok.train_from_iterator(chunks, trainer=trainer)
    return tok


def train_sentencepiece_style(training_text):
    """A byte_fallback BPE in Llama-2's tokenizer.json layout (what Mistral and Gemma ship, less
    Gemma's Split pre-tokenizer and Prepend)."""
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    trainer = trainers.BpeTrainer(vocab_size=3000, special_tokens=["<unk>", "<s>", "</s>"] + byte_tokens,
                                  limit_alphabet=200, show_progress=False)
    chunks = [training_text[i:i + 2000] for i in range(0, len(training_text), 2000)]
    tok.train_from_iterator(chunks, trainer=trainer)
    tok.post_processor = TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                            special_tokens=[("<s>", tok.token_to_id("<s>"))])
    return tok


def write_expected(tok, texts, path):
    with open(path, "w", encoding="utf-8") as f:
        for t in texts:
            ids = tok.encode(t, add_special_tokens=False).ids
            rec = {"ids": ids, "ids_special": tok.encode(t, add_special_tokens=True).ids,
                   "decoded": tok.decode(ids, skip_special_tokens=False)}
            f.write(json.dumps(rec) + "\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--out-dir", required=True)
    args = ap.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    texts, training_text = build_corpus(args.data_dir)
    with open(os.path.join(args.out_dir, "corpus.jsonl"), "w", encoding="utf-8") as f:
        for t in texts:
            f.write(json.dumps({"text": t}) + "\n")

    # Qwen2 layout; merges rewritten as "a b" strings (the older tokenizer.json format).
    qwen = train(training_text, QWEN2_PATTERN, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    qwen.post_processor = ByteLevelProcessor(trim_offsets=False)
    qdir = os.path.join(args.out_dir, "qwen2")
    os.makedirs(qdir, exist_ok=True)
    j = json.loads(qwen.to_str())
    j["model"]["merges"] = [" ".join(m) for m in j["model"]["merges"]]
    with open(os.path.join(qdir, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False)
    qwen = Tokenizer.from_file(os.path.join(qdir, "tokenizer.json"))

    # Llama-3 layout.
    llama_specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    llama = train(training_text, LLAMA3_PATTERN, llama_specials)
    bos = llama.token_to_id("<|begin_of_text|>")
    llama.post_processor = ProcessorSequence([
        ByteLevelProcessor(trim_offsets=False),
        TemplateProcessing(single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B",
                           special_tokens=[("<|begin_of_text|>", bos)]),
    ])
    llama.add_special_tokens([AddedToken("<|mask|>", lstrip=True, rstrip=True, special=True, normalized=False)])
    llama.add_tokens([AddedToken("zzword", single_word=True, normalized=False),
                      AddedToken("xyzzy", normalized=True)])
    ldir = os.path.join(args.out_dir, "llama3")
    os.makedirs(ldir, exist_ok=True)
    j = json.loads(llama.to_str())
    j["model"]["ignore_merges"] = True
    with open(os.path.join(ldir, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False)
    llama = Tokenizer.from_file(os.path.join(ldir, "tokenizer.json"))

    # Phi-4-mini layout: o200k's split, no normalizer, its chat markers as special tokens.
    phi = train(training_text, O200K_PATTERN, ["<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"])
    phi.normalizer = None
    phi.post_processor = ByteLevelProcessor(trim_offsets=False)
    pdir = os.path.join(args.out_dir, "o200k")
    os.makedirs(pdir, exist_ok=True)
    phi.save(os.path.join(pdir, "tokenizer.json"))
    phi = Tokenizer.from_file(os.path.join(pdir, "tokenizer.json"))

    sp = train_sentencepiece_style(training_text)
    sdir = os.path.join(args.out_dir, "llama2")
    os.makedirs(sdir, exist_ok=True)
    sp.save(os.path.join(sdir, "tokenizer.json"))
    sp = Tokenizer.from_file(os.path.join(sdir, "tokenizer.json"))

    smol = Tokenizer.from_file(os.path.join(args.data_dir, "models", "SmolLM2-135M-Instruct", "tokenizer.json"))
    tokenizers = [("smollm2", smol), ("qwen2", qwen), ("llama3", llama), ("o200k", phi), ("llama2", sp)]
    gemma = os.path.join(args.data_dir, "models", "gemma-3-270m", "tokenizer.json")
    if os.path.exists(gemma):
        tokenizers.append(("gemma3", Tokenizer.from_file(gemma)))
    for name, tok in tokenizers:
        write_expected(tok, texts, os.path.join(args.out_dir, f"{name}.expected.jsonl"))
    print(f"{len(texts)} texts, {sum(len(t.encode()) for t in texts)} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
