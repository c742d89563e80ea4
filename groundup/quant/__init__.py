"""Weight-only quantization: int8 per channel, int4 in groups (round to nearest or GPTQ).

    from groundup.quant import quantize_model, save_quantized_model, load_quantized_model, is_quantized
    report = quantize_model(model, "gptq", bits=4, group_size=128, calibration=rows, act_order=True)
    save_quantized_model(model, "out/model-gptq4")          # + copy the tokenizer directory
    model = load_quantized_model("out/model-gptq4", device="cpu")   # a Transformer, ready for the engine

    formats.py        the int8 / int4 layouts (int4 packed planar per group) and round-to-nearest
    kernels.py        matmuls over quantized weights and which backend runs where (native, compiled, packed, dequant)
    native.py         the native CPU kernels: built once per machine, loaded, registered as torch ops
    native_src.py     their C++ source
    modules.py        QuantWeight, QuantLinear, QuantEmbedding, QuantMoE, QuantizedTransformer, dequantize_model
    quantize.py       quantize_model: a model's weights swapped for int8 / int4 ones, by RTN or GPTQ, in place
    units.py          the units quantized (linear layers, expert stacks, embeddings), RTN per unit, the report
    gptq.py           the GPTQ algorithm on one weight, and the Hessian it needs
    gptq_model.py     GPTQ over a whole model, block by block, Hessians per stage captured with hooks
    calibration.py    GPTQ's calibration rows: the user's records or the embedded corpus, tokenized
    spec.py           QuantSpec: the [quantization] table of model.toml
    quantized_dir.py  quantized model directories: save, detect, build on the meta device and load
    load.py           load_model: the load site that takes a float or a quantized model directory
    commands.py       `groundup quantize`
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
