"""Helpers that several test modules share: inputs, references, tolerances and harnesses.

These are not tests (pytest collects test_*.py only) and a test module imports shared
helpers from here, never from another test module: tests/test_test_layout.py holds the
suite to that. tests/conftest.py registers this package for pytest's assertion rewriting,
so a failing assert in a helper reports its values as one in a test does.

    quant_rows        random weight rows of every GGUF type, gguf's dequantization, same_bits
    native_reference  inputs and float64 references for native/'s kernels (CUDA, host and device)
    f16_attention     the float64 reference for the CPU's f16 attention kernels, and their tolerance
    emulated_cuda     whole models on the CUDA backend over the emulated driver (twins or real kernels)
    decode_steps      sessions stepped one token at a time: the plain references for batched and replayed decode
    llama_cpp_rules   the rules for comparing with llama.cpp's recorded results
    hostile_gguf      malformed GGUF files: the handcrafted cases, the mutation fuzzer, poisoned tensors
    facade            shared inputs for the Llama facade's tests
    server            a real uvicorn server in a thread, and an OpenAI client for it
"""
