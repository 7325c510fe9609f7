"""A tiny Llama-style causal LM and a byte-level BPE tokenizer, built on the fly (no downloads).

``save_tiny_model(path)`` writes both in the ``save_pretrained`` layout (``config.json``,
``model.safetensors``, ``tokenizer.json``, ``tokenizer_config.json``, ``chat_template.jinja``),
so a test or a bench loads them through ``TorchPolicy.from_pretrained`` exactly as a user's
checkpoint. Sizes:

- ``TINY``: 2 layers, hidden 64 (~70 k parameters): fast enough for unit tests.
- ``BENCH``: 4 layers, hidden 512 (~12 M parameters): large enough on CPU that a forward
  pass costs more than the Python around it, so batching and KV reuse show.

The tokenizer is trained on a small corpus of the prompt template, fenced bash blocks and
shell vocabulary; its chat template is ChatML (``<|im_start|>role\\n...<|im_end|>\\n``) and
its end-of-sequence token is ``<|im_end|>``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

CHATML_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL_TOKENS = ["<|pad|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]

_BASH_WORDS = (
    "ls cd cat echo grep sed awk sort uniq wc head tail find xargs mkdir rm cp mv chmod chown "
    "touch tar gzip git commit diff patch python3 sqlite3 make curl jq cut tr tee printf test "
    "export source bash sh true false exit for while do done if then else fi case esac in "
    "stdout stderr exit code output file directory task workdir README.md main.py data.csv"
)
_CORPUS = [
    "You are an agent working in a Linux terminal to complete a task.",
    "Each turn, reply with exactly one command in a fenced block:",
    "```bash\n<command>\n```",
    "You will see its exit code and output. When the task is complete, reply with <done/>.",
    "[exit code 0]\n",
    "[exit code 1]\n[stderr]\nNo such file or directory\n",
    "[timed out]\n",
    "error: no ```bash block and no done marker in the reply",
    _BASH_WORDS,
    "```bash\nls -la\n```",
    "```bash\ncat README.md | head -n 20\n```",
    "```bash\ngrep -rn TODO . | sort | uniq -c | sort -rn | head\n```",
    "```bash\nfind . -name '*.py' -type f | xargs wc -l\n```",
    "```bash\nsqlite3 data.db 'SELECT count(*) FROM sales;'\n```",
    "```bash\ngit log --oneline -n 5 && git status\n```",
    "<done/>",
    "Fix the failing tests, then write the answer to /workspace/out.txt.",
    "0 1 2 3 4 5 6 7 8 9 10 42 100 2024 a b c x y z",
]


@dataclass(frozen=True)
class TinySize:
    """Architecture knobs of a ``LlamaConfig``."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    vocab_size: int  # the tokenizer's target vocabulary (BPE may stop short of it)
    max_position_embeddings: int = 4096


TINY = TinySize(64, 2, 4, 2, 128, 512)
BENCH = TinySize(512, 4, 8, 4, 1408, 1024)


def build_tokenizer(*, vocab_size: int = 512, chat_template: bool = True):  # noqa: ANN201
    """A byte-level BPE ``PreTrainedTokenizerFast`` trained on ``_CORPUS`` (ChatML template)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|pad|>",
        unk_token=None,
    )
    fast.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|endoftext|>"]})
    if chat_template:
        fast.chat_template = CHATML_TEMPLATE
    return fast


def build_model(tokenizer, size: TinySize = TINY, *, seed: int = 0):  # noqa: ANN001, ANN201
    """A randomly initialised ``LlamaForCausalLM`` of ``size`` over ``tokenizer``'s vocab."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=size.hidden_size,
        num_hidden_layers=size.num_hidden_layers,
        num_attention_heads=size.num_attention_heads,
        num_key_value_heads=size.num_key_value_heads,
        intermediate_size=size.intermediate_size,
        max_position_embeddings=size.max_position_embeddings,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=False,
        initializer_range=0.05,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model.eval()


def save_tiny_model(
    path: str | Path, size: TinySize = TINY, *, seed: int = 0, chat_template: bool = True
) -> Path:
    """Build the tokenizer and the model and ``save_pretrained`` both into ``path``."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(vocab_size=size.vocab_size, chat_template=chat_template)
    model = build_model(tokenizer, size, seed=seed)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
