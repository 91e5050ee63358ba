"""Renders conversations with transformers' apply_chat_template, for oomb's chat template test.

Usage: chat_template_reference.py --tokenizer-dir DIR --template FILE --bos TOKEN --eos TOKEN --cases FILE --out FILE

FILE --cases holds a JSON list of {"messages": [{"role", "content"}...], "add_generation_prompt": bool}.
--template is a Jinja file to use instead of the tokenizer's own template (empty: its own).
--bos / --eos set the template's bos_token / eos_token (empty: the tokenizer's own).
Writes a JSON list of the rendered strings to --out, null where the template raised (refused the
conversation).
"""
import argparse
import json
import sys

from jinja2.exceptions import TemplateError
from transformers import AutoTokenizer


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer-dir", required=True)
    ap.add_argument("--template", default="")
    ap.add_argument("--bos", default="")
    ap.add_argument("--eos", default="")
    ap.add_argument("--cases", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    tok = AutoTokenizer.from_pretrained(args.tokenizer_dir)
    template = open(args.template, encoding="utf-8").read() if args.template else None
    extra = {}
    if args.bos:
        extra["bos_token"] = args.bos
    if args.eos:
        extra["eos_token"] = args.eos
    with open(args.cases, encoding="utf-8") as f:
        cases = json.load(f)
    out = []
    for c in cases:
        try:
            out.append(tok.apply_chat_template(c["messages"], chat_template=template, tokenize=False,
                                               add_generation_prompt=c["add_generation_prompt"], **extra))
        except TemplateError:
            out.append(None)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
