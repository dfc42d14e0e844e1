"""The file types `edgekv quantize` writes, by name, as plain strings.

Apart from quantize/plan.py (which turns them into gguf's enums) so that the command line can
list them in its help without importing the gguf package at every start (~45 ms).
"""

# name -> (gguf's LlamaFileType member, the GGMLQuantizationType of a tensor no rule touches)
FILE_TYPE_NAMES: dict[str, tuple[str, str]] = {
    "F32": ("ALL_F32", "F32"), "F16": ("MOSTLY_F16", "F16"), "BF16": ("MOSTLY_BF16", "BF16"),
    "Q8_0": ("MOSTLY_Q8_0", "Q8_0"), "Q4_0": ("MOSTLY_Q4_0", "Q4_0"), "Q4_1": ("MOSTLY_Q4_1", "Q4_1"),
    "Q5_0": ("MOSTLY_Q5_0", "Q5_0"), "Q5_1": ("MOSTLY_Q5_1", "Q5_1"),
    "Q4_K_S": ("MOSTLY_Q4_K_S", "Q4_K"), "Q4_K_M": ("MOSTLY_Q4_K_M", "Q4_K"),
    "Q5_K_S": ("MOSTLY_Q5_K_S", "Q5_K"), "Q5_K_M": ("MOSTLY_Q5_K_M", "Q5_K"),
    "Q6_K": ("MOSTLY_Q6_K", "Q6_K"),
    "Q2_K": ("MOSTLY_Q2_K", "Q2_K"), "Q2_K_S": ("MOSTLY_Q2_K_S", "Q2_K"),
    "Q3_K_S": ("MOSTLY_Q3_K_S", "Q3_K"), "Q3_K_M": ("MOSTLY_Q3_K_M", "Q3_K"), "Q3_K_L": ("MOSTLY_Q3_K_L", "Q3_K"),
    "IQ4_NL": ("MOSTLY_IQ4_NL", "IQ4_NL"), "IQ4_XS": ("MOSTLY_IQ4_XS", "IQ4_XS"),
}
ALIASES = {"Q4_K": "Q4_K_M", "Q5_K": "Q5_K_M", "Q3_K": "Q3_K_M"}  # as llama-quantize names them
