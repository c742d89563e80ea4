"""Weight-only quantization: int8 per channel, int4 in groups (round to nearest or GPTQ).

    from groundup.quant import quantize_model, save_quantized_model, load_quantized_model, is_quantized
    report = quantize_model(model, "gptq", bits=4, group_size=128, calibration=rows, act_order=True)
    save_quantized_model(model, "out/model-gptq4")          # + copy the tokenizer directory
    model = load_quantized_model("out/model-gptq4", device="cpu")   # a Transformer, ready for the engine

formats.py    the int8 / int4 layouts and round-to-nearest
kernels.py    the matmuls over them and which runs where (compiled, PyTorch's packed kernels, fallback)
modules.py    QuantLinear, QuantEmbedding, QuantMoE, QuantizedTransformer, dequantize_model
gptq.py       the GPTQ algorithm; quantize.py runs it block by block over calibration activations
io.py         quantized model directories; spec.py their [quantization] table
commands.py   `groundup quantize`
"""

from groundup.quant.kernels import get_kernel_backend, set_kernel_backend
from groundup.quant.modules import (QuantEmbedding, QuantLinear, QuantMoE, QuantWeight, QuantizedTransformer,
                                    dequantize_model)
from groundup.quant.quantize import quantize_model
from groundup.quant.quantized_dir import is_quantized, load_quantized_model, read_quant_spec, save_quantized_model
from groundup.quant.spec import METHODS, QuantSpec
from groundup.quant.units import LayerReport, QuantizeReport

__all__ = ["LayerReport", "METHODS", "QuantEmbedding", "QuantLinear", "QuantMoE", "QuantSpec", "QuantWeight",
           "QuantizeReport", "QuantizedTransformer", "dequantize_model", "get_kernel_backend", "is_quantized",
           "load_quantized_model", "quantize_model", "read_quant_spec", "save_quantized_model", "set_kernel_backend"]
