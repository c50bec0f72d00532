#!/usr/bin/env python3
"""Multiple-choice task scores of a Hugging Face Mixtral folder, computed without atoll: for
tests/cli/eval_task_test.cc. It reads a task file (docs/tasks.md: "context" or HellaSwag's "ctx",
"endings", "label"), tokenises with SentencePiece itself (the context alone, each ending as
" " + ending unless it starts with whitespace), keeps the last seq_len + 1 tokens of context and
ending, runs the numpy forward of hf_moe.py (a transcription of transformers' Mixtral) on exactly
those tokens, no padding, and sums the log-probabilities of the ending's tokens, as llm.c's
HellaSwag evaluation and lm-evaluation-harness do. acc: argmax of the sums; acc_norm: argmax of
each sum over the ending's length in UTF-8 bytes; ties to the first (numpy's argmax).

    task_scores.py HF_DIR TOKENIZER SEQ_LEN FILE...   -> one JSON line per file:
        {"task", "items", "acc", "acc_norm", "truncated", "loglik": [[per ending] per item]}
"""
import json
import os
import sys

import numpy as np
import sentencepiece as spm

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_moe  # noqa: E402


def items(path):
    for line in open(path, encoding="utf-8"):
        if line.strip():
            row = json.loads(line)
            yield row["context"] if "context" in row else row["ctx"], row["endings"], int(row["label"])


def score(cfg, W, sp, T, path):
    lls, right, right_norm, truncated = [], 0, 0, 0
    for ctx, endings, label in items(path):
        c = sp.encode(ctx)
        ll, cut = [], False
        for e in endings:
            t = sp.encode(e if e[0] in " \t\n\r" else " " + e)
            seq = c + t
            if len(seq) > T + 1:
                seq, cut = seq[len(seq) - (T + 1):], True
            ids = np.array([seq[:-1]], np.int64)
            lp = hf_moe.log_probs(cfg, W, ids)
            n = len(seq)
            ll.append(float(sum(lp[p, seq[p + 1]] for p in range(n - 1 - len(t), n - 1))))
        lls.append(ll)
        right += int(np.argmax(ll)) == label
        right_norm += int(np.argmax([x / len(e.encode("utf-8")) for x, e in zip(ll, endings)])) == label
        truncated += cut
    name = os.path.basename(path).rsplit(".", 1)[0]
    return {"task": name, "items": len(lls), "acc": right / len(lls), "acc_norm": right_norm / len(lls),
            "truncated": truncated, "loglik": lls}


def main():
    d, tok, T = sys.argv[1], sys.argv[2], int(sys.argv[3])
    cfg, W = hf_moe.load(d)
    sp = spm.SentencePieceProcessor(model_file=tok)
    for path in sys.argv[4:]:
        print(json.dumps(score(cfg, W, sp, T, path)))


if __name__ == "__main__":
    main()
