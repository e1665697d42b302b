"""``kgstream_model_*``: calls, inputs and tokens by purpose and model."""

from __future__ import annotations

from prometheus_client import Counter

from services.core.model_meter import ModelMeter

MODEL_CALLS = Counter(
    "kgstream_model_calls_total", "Calls to a model, by purpose and model", ["purpose", "model"]
)
MODEL_INPUTS = Counter(
    "kgstream_model_inputs_total",
    "Texts sent to a model, by purpose and model",
    ["purpose", "model"],
)
MODEL_TOKENS = Counter(
    "kgstream_model_tokens_total",
    "Tokens the model endpoint reported, by purpose, model and kind (prompt, completion)",
    ["purpose", "model", "kind"],
)


class PrometheusModelMeter(ModelMeter):
    """The ModelMeter (services/core/model_meter.py) that counts into the metrics above."""

    def model_call(
        self,
        purpose: str,
        model: str,
        *,
        inputs: int,
        calls: int = 1,
        prompt_tokens: int = 0,
        completion_tokens: int = 0,
    ) -> None:
        """Count one report."""
        MODEL_CALLS.labels(purpose=purpose, model=model).inc(calls)
        MODEL_INPUTS.labels(purpose=purpose, model=model).inc(inputs)
        if prompt_tokens:
            MODEL_TOKENS.labels(purpose=purpose, model=model, kind="prompt").inc(prompt_tokens)
        if completion_tokens:
            MODEL_TOKENS.labels(purpose=purpose, model=model, kind="completion").inc(
                completion_tokens
            )
