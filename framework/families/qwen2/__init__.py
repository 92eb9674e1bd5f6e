"""The Qwen2 family (Qwen2, Qwen2.5): Llama's blocks with biases on the query, key and
value projections. Sliding-window attention is refused (every layer attends to all
earlier tokens).

    blocks.py   Qwen2Decoder: LlamaDecoder whose q/k/v projection has a bias
    hf.py       Qwen2ForCausalLM's config and tensor names, both ways
    rules.py    its config rules (Llama's)
    spec.py     FAMILY
"""
