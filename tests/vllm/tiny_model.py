"""Write a tiny random-weight Llama as a Hugging Face model directory.

Run with the vLLM venv's python: ``python tiny_model.py OUTDIR``. Offline and
deterministic: the tokenizer (byte-level BPE, 1024 tokens) is trained here on a
generated corpus, the weights come from a fixed seed. Written to a temporary
sibling directory and renamed into place, so a half-written model never looks
complete. Does nothing when OUTDIR already holds config.json and tokenizer.json.
"""

import json
import random
import shutil
import sys
import tempfile
from pathlib import Path

SEED = 1234
VOCAB = 1024
SPECIALS = ["<unk>", "<s>", "</s>", "<pad>"]  # ids 0..3
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)
WORDS = (
    "the of and to in is it that for on with as was at by be this from or have an are not but "
    "what all were when we there can your which their said if do will each about how up out them "
    "then she many some so these would other into has more her two like him see time could no make "
    "than first been its who now people my made over did down only way find use may water long "
    "little very after words called just where most know get through back much before go good new "
    "write our used me man too any day same right look think also around another came come work "
    "three word must because does part even place well such here take why things help put years "
    "different away again off went old number great tell men say small every found still between "
    "name should home big give air line set own under read last never us left end along while might "
    "next sound below saw something thought both few those always looked show large often together "
    "asked house world going want school important until form food keep children feet land side "
    "without boy once animals life enough took sometimes four head above kind began almost live page "
    "got earth need far hand high year mother light parts country father let night following picture "
    "being study second eyes soon times story boys since white days ever paper hard near sentence "
    "better best across during today others sure means knew its try told young miles sun ways thing "
    "whole hear example heard several change answer room sea against top turned learn point city play "
    "toward five using himself usually model token server request metric latency trace span queue"
).split()


def corpus(lines: int = 20000):
    """Seeded English-ish sentences, with some digits and punctuation."""
    rng = random.Random(SEED)
    for _ in range(lines):
        words = [rng.choice(WORDS) for _ in range(rng.randint(4, 16))]
        words[0] = words[0].capitalize()
        if rng.random() < 0.2:
            words.insert(rng.randrange(len(words)), str(rng.randint(0, 999)))
        yield " ".join(words) + rng.choice([".", ".", "?", "!", ",", ":"])


def write_tokenizer(out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)]
    )
    tok.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "pad_token": "<pad>",
        "unk_token": "<unk>",
        "add_bos_token": True,
        "add_eos_token": False,
        "model_max_length": 1024,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    specials = {k: config[k] for k in ("bos_token", "eos_token", "pad_token", "unk_token")}
    (out / "special_tokens_map.json").write_text(json.dumps(specials, indent=2) + "\n")


def write_model(out: Path) -> None:
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    ids = {name: i for i, name in enumerate(SPECIALS)}
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        bos_token_id=ids["<s>"],
        eos_token_id=ids["</s>"],
        pad_token_id=ids["<pad>"],
        tie_word_embeddings=False,
        dtype="bfloat16",
    )
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(config).to(torch.bfloat16).eval()
    model.save_pretrained(out, safe_serialization=True)
    GenerationConfig(
        bos_token_id=ids["<s>"], eos_token_id=ids["</s>"], pad_token_id=ids["<pad>"]
    ).save_pretrained(out)


def main(outdir: str) -> None:
    out = Path(outdir).resolve()
    if (out / "config.json").exists() and (out / "tokenizer.json").exists():
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".tmp-", dir=out.parent))
    try:
        write_tokenizer(tmp)
        write_model(tmp)
        tmp.chmod(0o755)  # mkdtemp makes it 0700
        if out.exists():  # an empty or foreign leftover; never a complete model (checked above)
            shutil.rmtree(out)
        tmp.rename(out)
    except OSError:
        if not (out / "config.json").exists():  # lost a race only if someone else finished
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"tiny model written to {out}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: tiny_model.py OUTDIR")
    main(sys.argv[1])
