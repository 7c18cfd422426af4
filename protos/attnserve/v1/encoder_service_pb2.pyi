from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Dtype(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DTYPE_UNSPECIFIED: _ClassVar[Dtype]
    DTYPE_FLOAT32: _ClassVar[Dtype]
    DTYPE_FLOAT16: _ClassVar[Dtype]
    DTYPE_INT32: _ClassVar[Dtype]

class Pooling(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    POOLING_UNSPECIFIED: _ClassVar[Pooling]
    POOLING_NONE: _ClassVar[Pooling]
    POOLING_MEAN: _ClassVar[Pooling]
    POOLING_LAST: _ClassVar[Pooling]

class AttentionLayout(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ATTENTION_LAYOUT_UNSPECIFIED: _ClassVar[AttentionLayout]
    ATTENTION_LAYOUT_FULL: _ClassVar[AttentionLayout]
    ATTENTION_LAYOUT_CAUSAL_PACKED: _ClassVar[AttentionLayout]

class HeadReduction(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    HEAD_REDUCTION_UNSPECIFIED: _ClassVar[HeadReduction]
    HEAD_REDUCTION_NONE: _ClassVar[HeadReduction]
    HEAD_REDUCTION_MEAN: _ClassVar[HeadReduction]
    HEAD_REDUCTION_MAX: _ClassVar[HeadReduction]

class LensNorm(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LENS_NORM_UNSPECIFIED: _ClassVar[LensNorm]
    LENS_NORM_FROZEN: _ClassVar[LensNorm]
    LENS_NORM_OWN: _ClassVar[LensNorm]

class InterventionOp(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    INTERVENTION_OP_UNSPECIFIED: _ClassVar[InterventionOp]
    INTERVENTION_OP_ADD: _ClassVar[InterventionOp]
    INTERVENTION_OP_SET: _ClassVar[InterventionOp]
    INTERVENTION_OP_SCALE: _ClassVar[InterventionOp]
    INTERVENTION_OP_CLAMP: _ClassVar[InterventionOp]

class PatchingMethod(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PATCHING_METHOD_UNSPECIFIED: _ClassVar[PatchingMethod]
    PATCHING_METHOD_ACTIVATION: _ClassVar[PatchingMethod]
    PATCHING_METHOD_ATTRIBUTION: _ClassVar[PatchingMethod]

class Truncation(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TRUNCATION_UNSPECIFIED: _ClassVar[Truncation]
    TRUNCATION_NONE: _ClassVar[Truncation]
    TRUNCATION_RIGHT: _ClassVar[Truncation]

class FinishReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FINISH_REASON_UNSPECIFIED: _ClassVar[FinishReason]
    FINISH_REASON_STOP: _ClassVar[FinishReason]
    FINISH_REASON_LENGTH: _ClassVar[FinishReason]
DTYPE_UNSPECIFIED: Dtype
DTYPE_FLOAT32: Dtype
DTYPE_FLOAT16: Dtype
DTYPE_INT32: Dtype
POOLING_UNSPECIFIED: Pooling
POOLING_NONE: Pooling
POOLING_MEAN: Pooling
POOLING_LAST: Pooling
ATTENTION_LAYOUT_UNSPECIFIED: AttentionLayout
ATTENTION_LAYOUT_FULL: AttentionLayout
ATTENTION_LAYOUT_CAUSAL_PACKED: AttentionLayout
HEAD_REDUCTION_UNSPECIFIED: HeadReduction
HEAD_REDUCTION_NONE: HeadReduction
HEAD_REDUCTION_MEAN: HeadReduction
HEAD_REDUCTION_MAX: HeadReduction
LENS_NORM_UNSPECIFIED: LensNorm
LENS_NORM_FROZEN: LensNorm
LENS_NORM_OWN: LensNorm
INTERVENTION_OP_UNSPECIFIED: InterventionOp
INTERVENTION_OP_ADD: InterventionOp
INTERVENTION_OP_SET: InterventionOp
INTERVENTION_OP_SCALE: InterventionOp
INTERVENTION_OP_CLAMP: InterventionOp
PATCHING_METHOD_UNSPECIFIED: PatchingMethod
PATCHING_METHOD_ACTIVATION: PatchingMethod
PATCHING_METHOD_ATTRIBUTION: PatchingMethod
TRUNCATION_UNSPECIFIED: Truncation
TRUNCATION_NONE: Truncation
TRUNCATION_RIGHT: Truncation
FINISH_REASON_UNSPECIFIED: FinishReason
FINISH_REASON_STOP: FinishReason
FINISH_REASON_LENGTH: FinishReason

class Tensor(_message.Message):
    __slots__ = ("shape", "dtype", "data")
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    shape: _containers.RepeatedScalarFieldContainer[int]
    dtype: Dtype
    data: bytes
    def __init__(self, shape: _Optional[_Iterable[int]] = ..., dtype: _Optional[_Union[Dtype, str]] = ..., data: _Optional[bytes] = ...) -> None: ...

class TokenIds(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ids: _Optional[_Iterable[int]] = ...) -> None: ...

class Input(_message.Message):
    __slots__ = ("text", "token_ids")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    text: str
    token_ids: TokenIds
    def __init__(self, text: _Optional[str] = ..., token_ids: _Optional[_Union[TokenIds, _Mapping]] = ...) -> None: ...

class AttentionRequest(_message.Message):
    __slots__ = ("layers", "heads", "dtype", "layout", "query_positions", "head_reduction", "rollout", "top_k", "head_entropy", "omit_weights", "row_entropy", "received", "key_start", "key_end")
    LAYERS_FIELD_NUMBER: _ClassVar[int]
    HEADS_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    QUERY_POSITIONS_FIELD_NUMBER: _ClassVar[int]
    HEAD_REDUCTION_FIELD_NUMBER: _ClassVar[int]
    ROLLOUT_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    HEAD_ENTROPY_FIELD_NUMBER: _ClassVar[int]
    OMIT_WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    ROW_ENTROPY_FIELD_NUMBER: _ClassVar[int]
    RECEIVED_FIELD_NUMBER: _ClassVar[int]
    KEY_START_FIELD_NUMBER: _ClassVar[int]
    KEY_END_FIELD_NUMBER: _ClassVar[int]
    layers: _containers.RepeatedScalarFieldContainer[int]
    heads: _containers.RepeatedScalarFieldContainer[int]
    dtype: Dtype
    layout: AttentionLayout
    query_positions: _containers.RepeatedScalarFieldContainer[int]
    head_reduction: HeadReduction
    rollout: bool
    top_k: int
    head_entropy: bool
    omit_weights: bool
    row_entropy: bool
    received: bool
    key_start: int
    key_end: int
    def __init__(self, layers: _Optional[_Iterable[int]] = ..., heads: _Optional[_Iterable[int]] = ..., dtype: _Optional[_Union[Dtype, str]] = ..., layout: _Optional[_Union[AttentionLayout, str]] = ..., query_positions: _Optional[_Iterable[int]] = ..., head_reduction: _Optional[_Union[HeadReduction, str]] = ..., rollout: _Optional[bool] = ..., top_k: _Optional[int] = ..., head_entropy: _Optional[bool] = ..., omit_weights: _Optional[bool] = ..., row_entropy: _Optional[bool] = ..., received: _Optional[bool] = ..., key_start: _Optional[int] = ..., key_end: _Optional[int] = ...) -> None: ...

class HiddenStatesRequest(_message.Message):
    __slots__ = ("layers", "positions", "norms", "omit_states")
    LAYERS_FIELD_NUMBER: _ClassVar[int]
    POSITIONS_FIELD_NUMBER: _ClassVar[int]
    NORMS_FIELD_NUMBER: _ClassVar[int]
    OMIT_STATES_FIELD_NUMBER: _ClassVar[int]
    layers: _containers.RepeatedScalarFieldContainer[int]
    positions: _containers.RepeatedScalarFieldContainer[int]
    norms: bool
    omit_states: bool
    def __init__(self, layers: _Optional[_Iterable[int]] = ..., positions: _Optional[_Iterable[int]] = ..., norms: _Optional[bool] = ..., omit_states: _Optional[bool] = ...) -> None: ...

class TokenPredictionsRequest(_message.Message):
    __slots__ = ("layers", "positions", "top_k", "target_ids", "logits", "lens_norm")
    LAYERS_FIELD_NUMBER: _ClassVar[int]
    POSITIONS_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    TARGET_IDS_FIELD_NUMBER: _ClassVar[int]
    LOGITS_FIELD_NUMBER: _ClassVar[int]
    LENS_NORM_FIELD_NUMBER: _ClassVar[int]
    layers: _containers.RepeatedScalarFieldContainer[int]
    positions: _containers.RepeatedScalarFieldContainer[int]
    top_k: int
    target_ids: _containers.RepeatedScalarFieldContainer[int]
    logits: bool
    lens_norm: LensNorm
    def __init__(self, layers: _Optional[_Iterable[int]] = ..., positions: _Optional[_Iterable[int]] = ..., top_k: _Optional[int] = ..., target_ids: _Optional[_Iterable[int]] = ..., logits: _Optional[bool] = ..., lens_norm: _Optional[_Union[LensNorm, str]] = ...) -> None: ...

class LogitAttributionRequest(_message.Message):
    __slots__ = ("positions", "target_ids", "contrast_ids")
    POSITIONS_FIELD_NUMBER: _ClassVar[int]
    TARGET_IDS_FIELD_NUMBER: _ClassVar[int]
    CONTRAST_IDS_FIELD_NUMBER: _ClassVar[int]
    positions: _containers.RepeatedScalarFieldContainer[int]
    target_ids: _containers.RepeatedScalarFieldContainer[int]
    contrast_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, positions: _Optional[_Iterable[int]] = ..., target_ids: _Optional[_Iterable[int]] = ..., contrast_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class FeaturesRequest(_message.Message):
    __slots__ = ("saes", "positions", "top_k", "feature_ids", "dense", "skip_first_token", "skip_error_norm")
    SAES_FIELD_NUMBER: _ClassVar[int]
    POSITIONS_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    FEATURE_IDS_FIELD_NUMBER: _ClassVar[int]
    DENSE_FIELD_NUMBER: _ClassVar[int]
    SKIP_FIRST_TOKEN_FIELD_NUMBER: _ClassVar[int]
    SKIP_ERROR_NORM_FIELD_NUMBER: _ClassVar[int]
    saes: _containers.RepeatedScalarFieldContainer[str]
    positions: _containers.RepeatedScalarFieldContainer[int]
    top_k: int
    feature_ids: _containers.RepeatedScalarFieldContainer[int]
    dense: bool
    skip_first_token: bool
    skip_error_norm: bool
    def __init__(self, saes: _Optional[_Iterable[str]] = ..., positions: _Optional[_Iterable[int]] = ..., top_k: _Optional[int] = ..., feature_ids: _Optional[_Iterable[int]] = ..., dense: _Optional[bool] = ..., skip_first_token: _Optional[bool] = ..., skip_error_norm: _Optional[bool] = ...) -> None: ...

class SAEFeatures(_message.Message):
    __slots__ = ("saes", "positions", "top_ids", "top_activations", "l0", "error_norm", "feature_ids", "feature_activations", "activations")
    SAES_FIELD_NUMBER: _ClassVar[int]
    POSITIONS_FIELD_NUMBER: _ClassVar[int]
    TOP_IDS_FIELD_NUMBER: _ClassVar[int]
    TOP_ACTIVATIONS_FIELD_NUMBER: _ClassVar[int]
    L0_FIELD_NUMBER: _ClassVar[int]
    ERROR_NORM_FIELD_NUMBER: _ClassVar[int]
    FEATURE_IDS_FIELD_NUMBER: _ClassVar[int]
    FEATURE_ACTIVATIONS_FIELD_NUMBER: _ClassVar[int]
    ACTIVATIONS_FIELD_NUMBER: _ClassVar[int]
    saes: _containers.RepeatedScalarFieldContainer[str]
    positions: _containers.RepeatedScalarFieldContainer[int]
    top_ids: Tensor
    top_activations: Tensor
    l0: Tensor
    error_norm: Tensor
    feature_ids: _containers.RepeatedScalarFieldContainer[int]
    feature_activations: Tensor
    activations: Tensor
    def __init__(self, saes: _Optional[_Iterable[str]] = ..., positions: _Optional[_Iterable[int]] = ..., top_ids: _Optional[_Union[Tensor, _Mapping]] = ..., top_activations: _Optional[_Union[Tensor, _Mapping]] = ..., l0: _Optional[_Union[Tensor, _Mapping]] = ..., error_norm: _Optional[_Union[Tensor, _Mapping]] = ..., feature_ids: _Optional[_Iterable[int]] = ..., feature_activations: _Optional[_Union[Tensor, _Mapping]] = ..., activations: _Optional[_Union[Tensor, _Mapping]] = ...) -> None: ...

class SAEInfo(_message.Message):
    __slots__ = ("name", "hook_name", "architecture", "d_in", "d_sae", "hook_name_out")
    NAME_FIELD_NUMBER: _ClassVar[int]
    HOOK_NAME_FIELD_NUMBER: _ClassVar[int]
    ARCHITECTURE_FIELD_NUMBER: _ClassVar[int]
    D_IN_FIELD_NUMBER: _ClassVar[int]
    D_SAE_FIELD_NUMBER: _ClassVar[int]
    HOOK_NAME_OUT_FIELD_NUMBER: _ClassVar[int]
    name: str
    hook_name: str
    architecture: str
    d_in: int
    d_sae: int
    hook_name_out: str
    def __init__(self, name: _Optional[str] = ..., hook_name: _Optional[str] = ..., architecture: _Optional[str] = ..., d_in: _Optional[int] = ..., d_sae: _Optional[int] = ..., hook_name_out: _Optional[str] = ...) -> None: ...

class HeadScale(_message.Message):
    __slots__ = ("layer", "head", "scale", "mean")
    LAYER_FIELD_NUMBER: _ClassVar[int]
    HEAD_FIELD_NUMBER: _ClassVar[int]
    SCALE_FIELD_NUMBER: _ClassVar[int]
    MEAN_FIELD_NUMBER: _ClassVar[int]
    layer: int
    head: int
    scale: float
    mean: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, layer: _Optional[int] = ..., head: _Optional[int] = ..., scale: _Optional[float] = ..., mean: _Optional[_Iterable[float]] = ...) -> None: ...

class Intervention(_message.Message):
    __slots__ = ("hook", "op", "values", "scale", "positions", "heads", "feature")
    HOOK_FIELD_NUMBER: _ClassVar[int]
    OP_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    SCALE_FIELD_NUMBER: _ClassVar[int]
    POSITIONS_FIELD_NUMBER: _ClassVar[int]
    HEADS_FIELD_NUMBER: _ClassVar[int]
    FEATURE_FIELD_NUMBER: _ClassVar[int]
    hook: str
    op: InterventionOp
    values: Tensor
    scale: float
    positions: _containers.RepeatedScalarFieldContainer[int]
    heads: _containers.RepeatedScalarFieldContainer[int]
    feature: FeatureDirection
    def __init__(self, hook: _Optional[str] = ..., op: _Optional[_Union[InterventionOp, str]] = ..., values: _Optional[_Union[Tensor, _Mapping]] = ..., scale: _Optional[float] = ..., positions: _Optional[_Iterable[int]] = ..., heads: _Optional[_Iterable[int]] = ..., feature: _Optional[_Union[FeatureDirection, _Mapping]] = ...) -> None: ...

class FeatureDirection(_message.Message):
    __slots__ = ("sae", "feature_id")
    SAE_FIELD_NUMBER: _ClassVar[int]
    FEATURE_ID_FIELD_NUMBER: _ClassVar[int]
    sae: str
    feature_id: int
    def __init__(self, sae: _Optional[str] = ..., feature_id: _Optional[int] = ...) -> None: ...

class CaptureRequest(_message.Message):
    __slots__ = ("hooks", "positions")
    HOOKS_FIELD_NUMBER: _ClassVar[int]
    POSITIONS_FIELD_NUMBER: _ClassVar[int]
    hooks: _containers.RepeatedScalarFieldContainer[str]
    positions: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, hooks: _Optional[_Iterable[str]] = ..., positions: _Optional[_Iterable[int]] = ...) -> None: ...

class PatchingRequest(_message.Message):
    __slots__ = ("source", "hook", "target_id", "target", "contrast_id", "contrast", "method")
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    HOOK_FIELD_NUMBER: _ClassVar[int]
    TARGET_ID_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    CONTRAST_ID_FIELD_NUMBER: _ClassVar[int]
    CONTRAST_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    source: Input
    hook: str
    target_id: int
    target: str
    contrast_id: int
    contrast: str
    method: PatchingMethod
    def __init__(self, source: _Optional[_Union[Input, _Mapping]] = ..., hook: _Optional[str] = ..., target_id: _Optional[int] = ..., target: _Optional[str] = ..., contrast_id: _Optional[int] = ..., contrast: _Optional[str] = ..., method: _Optional[_Union[PatchingMethod, str]] = ...) -> None: ...

class ActivationPatching(_message.Message):
    __slots__ = ("hook", "values", "clean", "corrupted", "warning", "saliency")
    HOOK_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    CLEAN_FIELD_NUMBER: _ClassVar[int]
    CORRUPTED_FIELD_NUMBER: _ClassVar[int]
    WARNING_FIELD_NUMBER: _ClassVar[int]
    SALIENCY_FIELD_NUMBER: _ClassVar[int]
    hook: str
    values: Tensor
    clean: float
    corrupted: float
    warning: str
    saliency: Tensor
    def __init__(self, hook: _Optional[str] = ..., values: _Optional[_Union[Tensor, _Mapping]] = ..., clean: _Optional[float] = ..., corrupted: _Optional[float] = ..., warning: _Optional[str] = ..., saliency: _Optional[_Union[Tensor, _Mapping]] = ...) -> None: ...

class EncodeOptions(_message.Message):
    __slots__ = ("pooling", "skip_token_embeddings", "attention", "truncation", "return_tokens", "hidden_states", "predictions", "logit_lens", "head_mask", "attribution", "features", "interventions", "capture", "patching")
    POOLING_FIELD_NUMBER: _ClassVar[int]
    SKIP_TOKEN_EMBEDDINGS_FIELD_NUMBER: _ClassVar[int]
    ATTENTION_FIELD_NUMBER: _ClassVar[int]
    TRUNCATION_FIELD_NUMBER: _ClassVar[int]
    RETURN_TOKENS_FIELD_NUMBER: _ClassVar[int]
    HIDDEN_STATES_FIELD_NUMBER: _ClassVar[int]
    PREDICTIONS_FIELD_NUMBER: _ClassVar[int]
    LOGIT_LENS_FIELD_NUMBER: _ClassVar[int]
    HEAD_MASK_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTION_FIELD_NUMBER: _ClassVar[int]
    FEATURES_FIELD_NUMBER: _ClassVar[int]
    INTERVENTIONS_FIELD_NUMBER: _ClassVar[int]
    CAPTURE_FIELD_NUMBER: _ClassVar[int]
    PATCHING_FIELD_NUMBER: _ClassVar[int]
    pooling: Pooling
    skip_token_embeddings: bool
    attention: AttentionRequest
    truncation: Truncation
    return_tokens: bool
    hidden_states: HiddenStatesRequest
    predictions: TokenPredictionsRequest
    logit_lens: TokenPredictionsRequest
    head_mask: _containers.RepeatedCompositeFieldContainer[HeadScale]
    attribution: LogitAttributionRequest
    features: FeaturesRequest
    interventions: _containers.RepeatedCompositeFieldContainer[Intervention]
    capture: CaptureRequest
    patching: PatchingRequest
    def __init__(self, pooling: _Optional[_Union[Pooling, str]] = ..., skip_token_embeddings: _Optional[bool] = ..., attention: _Optional[_Union[AttentionRequest, _Mapping]] = ..., truncation: _Optional[_Union[Truncation, str]] = ..., return_tokens: _Optional[bool] = ..., hidden_states: _Optional[_Union[HiddenStatesRequest, _Mapping]] = ..., predictions: _Optional[_Union[TokenPredictionsRequest, _Mapping]] = ..., logit_lens: _Optional[_Union[TokenPredictionsRequest, _Mapping]] = ..., head_mask: _Optional[_Iterable[_Union[HeadScale, _Mapping]]] = ..., attribution: _Optional[_Union[LogitAttributionRequest, _Mapping]] = ..., features: _Optional[_Union[FeaturesRequest, _Mapping]] = ..., interventions: _Optional[_Iterable[_Union[Intervention, _Mapping]]] = ..., capture: _Optional[_Union[CaptureRequest, _Mapping]] = ..., patching: _Optional[_Union[PatchingRequest, _Mapping]] = ...) -> None: ...

class EncodeRequest(_message.Message):
    __slots__ = ("inputs", "options", "request_id", "model")
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    inputs: _containers.RepeatedCompositeFieldContainer[Input]
    options: EncodeOptions
    request_id: str
    model: str
    def __init__(self, inputs: _Optional[_Iterable[_Union[Input, _Mapping]]] = ..., options: _Optional[_Union[EncodeOptions, _Mapping]] = ..., request_id: _Optional[str] = ..., model: _Optional[str] = ...) -> None: ...

class EncodeResult(_message.Message):
    __slots__ = ("token_ids", "embeddings", "pooled", "attention", "attention_layers", "attention_heads", "truncated", "tokens", "attention_rows", "attention_indices", "head_entropy", "hidden_states", "hidden_state_layers", "hidden_state_positions", "hidden_state_norms", "predictions", "logit_lens", "attribution", "features", "activations", "activation_positions", "patching", "attention_received", "attention_row_entropy")
    class ActivationsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Tensor
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Tensor, _Mapping]] = ...) -> None: ...
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    EMBEDDINGS_FIELD_NUMBER: _ClassVar[int]
    POOLED_FIELD_NUMBER: _ClassVar[int]
    ATTENTION_FIELD_NUMBER: _ClassVar[int]
    ATTENTION_LAYERS_FIELD_NUMBER: _ClassVar[int]
    ATTENTION_HEADS_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    ATTENTION_ROWS_FIELD_NUMBER: _ClassVar[int]
    ATTENTION_INDICES_FIELD_NUMBER: _ClassVar[int]
    HEAD_ENTROPY_FIELD_NUMBER: _ClassVar[int]
    HIDDEN_STATES_FIELD_NUMBER: _ClassVar[int]
    HIDDEN_STATE_LAYERS_FIELD_NUMBER: _ClassVar[int]
    HIDDEN_STATE_POSITIONS_FIELD_NUMBER: _ClassVar[int]
    HIDDEN_STATE_NORMS_FIELD_NUMBER: _ClassVar[int]
    PREDICTIONS_FIELD_NUMBER: _ClassVar[int]
    LOGIT_LENS_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTION_FIELD_NUMBER: _ClassVar[int]
    FEATURES_FIELD_NUMBER: _ClassVar[int]
    ACTIVATIONS_FIELD_NUMBER: _ClassVar[int]
    ACTIVATION_POSITIONS_FIELD_NUMBER: _ClassVar[int]
    PATCHING_FIELD_NUMBER: _ClassVar[int]
    ATTENTION_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    ATTENTION_ROW_ENTROPY_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    embeddings: Tensor
    pooled: Tensor
    attention: Tensor
    attention_layers: _containers.RepeatedScalarFieldContainer[int]
    attention_heads: _containers.RepeatedScalarFieldContainer[int]
    truncated: bool
    tokens: _containers.RepeatedScalarFieldContainer[str]
    attention_rows: _containers.RepeatedScalarFieldContainer[int]
    attention_indices: Tensor
    head_entropy: Tensor
    hidden_states: Tensor
    hidden_state_layers: _containers.RepeatedScalarFieldContainer[int]
    hidden_state_positions: _containers.RepeatedScalarFieldContainer[int]
    hidden_state_norms: Tensor
    predictions: TokenPredictions
    logit_lens: TokenPredictions
    attribution: LogitAttribution
    features: SAEFeatures
    activations: _containers.MessageMap[str, Tensor]
    activation_positions: _containers.RepeatedScalarFieldContainer[int]
    patching: ActivationPatching
    attention_received: Tensor
    attention_row_entropy: Tensor
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., embeddings: _Optional[_Union[Tensor, _Mapping]] = ..., pooled: _Optional[_Union[Tensor, _Mapping]] = ..., attention: _Optional[_Union[Tensor, _Mapping]] = ..., attention_layers: _Optional[_Iterable[int]] = ..., attention_heads: _Optional[_Iterable[int]] = ..., truncated: _Optional[bool] = ..., tokens: _Optional[_Iterable[str]] = ..., attention_rows: _Optional[_Iterable[int]] = ..., attention_indices: _Optional[_Union[Tensor, _Mapping]] = ..., head_entropy: _Optional[_Union[Tensor, _Mapping]] = ..., hidden_states: _Optional[_Union[Tensor, _Mapping]] = ..., hidden_state_layers: _Optional[_Iterable[int]] = ..., hidden_state_positions: _Optional[_Iterable[int]] = ..., hidden_state_norms: _Optional[_Union[Tensor, _Mapping]] = ..., predictions: _Optional[_Union[TokenPredictions, _Mapping]] = ..., logit_lens: _Optional[_Union[TokenPredictions, _Mapping]] = ..., attribution: _Optional[_Union[LogitAttribution, _Mapping]] = ..., features: _Optional[_Union[SAEFeatures, _Mapping]] = ..., activations: _Optional[_Mapping[str, Tensor]] = ..., activation_positions: _Optional[_Iterable[int]] = ..., patching: _Optional[_Union[ActivationPatching, _Mapping]] = ..., attention_received: _Optional[_Union[Tensor, _Mapping]] = ..., attention_row_entropy: _Optional[_Union[Tensor, _Mapping]] = ...) -> None: ...

class LogitAttribution(_message.Message):
    __slots__ = ("positions", "target_ids", "contrast_ids", "heads", "attention_biases", "mlps", "embeddings", "constants")
    POSITIONS_FIELD_NUMBER: _ClassVar[int]
    TARGET_IDS_FIELD_NUMBER: _ClassVar[int]
    CONTRAST_IDS_FIELD_NUMBER: _ClassVar[int]
    HEADS_FIELD_NUMBER: _ClassVar[int]
    ATTENTION_BIASES_FIELD_NUMBER: _ClassVar[int]
    MLPS_FIELD_NUMBER: _ClassVar[int]
    EMBEDDINGS_FIELD_NUMBER: _ClassVar[int]
    CONSTANTS_FIELD_NUMBER: _ClassVar[int]
    positions: _containers.RepeatedScalarFieldContainer[int]
    target_ids: _containers.RepeatedScalarFieldContainer[int]
    contrast_ids: _containers.RepeatedScalarFieldContainer[int]
    heads: Tensor
    attention_biases: Tensor
    mlps: Tensor
    embeddings: Tensor
    constants: Tensor
    def __init__(self, positions: _Optional[_Iterable[int]] = ..., target_ids: _Optional[_Iterable[int]] = ..., contrast_ids: _Optional[_Iterable[int]] = ..., heads: _Optional[_Union[Tensor, _Mapping]] = ..., attention_biases: _Optional[_Union[Tensor, _Mapping]] = ..., mlps: _Optional[_Union[Tensor, _Mapping]] = ..., embeddings: _Optional[_Union[Tensor, _Mapping]] = ..., constants: _Optional[_Union[Tensor, _Mapping]] = ...) -> None: ...

class TokenPredictions(_message.Message):
    __slots__ = ("layers", "positions", "top_ids", "top_probabilities", "top_tokens", "target_probabilities", "logits")
    LAYERS_FIELD_NUMBER: _ClassVar[int]
    POSITIONS_FIELD_NUMBER: _ClassVar[int]
    TOP_IDS_FIELD_NUMBER: _ClassVar[int]
    TOP_PROBABILITIES_FIELD_NUMBER: _ClassVar[int]
    TOP_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TARGET_PROBABILITIES_FIELD_NUMBER: _ClassVar[int]
    LOGITS_FIELD_NUMBER: _ClassVar[int]
    layers: _containers.RepeatedScalarFieldContainer[int]
    positions: _containers.RepeatedScalarFieldContainer[int]
    top_ids: Tensor
    top_probabilities: Tensor
    top_tokens: _containers.RepeatedScalarFieldContainer[str]
    target_probabilities: Tensor
    logits: Tensor
    def __init__(self, layers: _Optional[_Iterable[int]] = ..., positions: _Optional[_Iterable[int]] = ..., top_ids: _Optional[_Union[Tensor, _Mapping]] = ..., top_probabilities: _Optional[_Union[Tensor, _Mapping]] = ..., top_tokens: _Optional[_Iterable[str]] = ..., target_probabilities: _Optional[_Union[Tensor, _Mapping]] = ..., logits: _Optional[_Union[Tensor, _Mapping]] = ...) -> None: ...

class Timings(_message.Message):
    __slots__ = ("queue_ns", "inference_ns", "total_ns")
    QUEUE_NS_FIELD_NUMBER: _ClassVar[int]
    INFERENCE_NS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_NS_FIELD_NUMBER: _ClassVar[int]
    queue_ns: int
    inference_ns: int
    total_ns: int
    def __init__(self, queue_ns: _Optional[int] = ..., inference_ns: _Optional[int] = ..., total_ns: _Optional[int] = ...) -> None: ...

class EncodeResponse(_message.Message):
    __slots__ = ("results", "timings", "model_version", "request_id")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[EncodeResult]
    timings: Timings
    model_version: str
    request_id: str
    def __init__(self, results: _Optional[_Iterable[_Union[EncodeResult, _Mapping]]] = ..., timings: _Optional[_Union[Timings, _Mapping]] = ..., model_version: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class EncodeStreamRequest(_message.Message):
    __slots__ = ("request",)
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    request: EncodeRequest
    def __init__(self, request: _Optional[_Union[EncodeRequest, _Mapping]] = ...) -> None: ...

class EncodeError(_message.Message):
    __slots__ = ("code", "message")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class EncodeStreamResponse(_message.Message):
    __slots__ = ("request_id", "response", "error")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    response: EncodeResponse
    error: EncodeError
    def __init__(self, request_id: _Optional[str] = ..., response: _Optional[_Union[EncodeResponse, _Mapping]] = ..., error: _Optional[_Union[EncodeError, _Mapping]] = ...) -> None: ...

class EncodeLayersRequest(_message.Message):
    __slots__ = ("request",)
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    request: EncodeRequest
    def __init__(self, request: _Optional[_Union[EncodeRequest, _Mapping]] = ...) -> None: ...

class AttentionLayer(_message.Message):
    __slots__ = ("result_index", "layer_index", "attention")
    RESULT_INDEX_FIELD_NUMBER: _ClassVar[int]
    LAYER_INDEX_FIELD_NUMBER: _ClassVar[int]
    ATTENTION_FIELD_NUMBER: _ClassVar[int]
    result_index: int
    layer_index: int
    attention: Tensor
    def __init__(self, result_index: _Optional[int] = ..., layer_index: _Optional[int] = ..., attention: _Optional[_Union[Tensor, _Mapping]] = ...) -> None: ...

class EncodeLayersResponse(_message.Message):
    __slots__ = ("response", "attention_layer")
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    ATTENTION_LAYER_FIELD_NUMBER: _ClassVar[int]
    response: EncodeResponse
    attention_layer: AttentionLayer
    def __init__(self, response: _Optional[_Union[EncodeResponse, _Mapping]] = ..., attention_layer: _Optional[_Union[AttentionLayer, _Mapping]] = ...) -> None: ...

class GetModelInfoRequest(_message.Message):
    __slots__ = ("model",)
    MODEL_FIELD_NUMBER: _ClassVar[int]
    model: str
    def __init__(self, model: _Optional[str] = ...) -> None: ...

class GetModelInfoResponse(_message.Message):
    __slots__ = ("name", "version", "n_layers", "n_heads", "d_model", "max_seq_len", "vocab_size", "tokenizer", "provider", "config_json", "max_message_bytes", "max_batch_tokens", "bos_id", "pad_id", "precision", "n_kv_heads", "kv_heads", "weight_bytes", "resident_weight_bytes", "attention_max_abs_diff", "embedding_cosine_min", "output_fidelity", "fidelity_scope", "saes", "generates", "chat_template", "eos_id", "transcoder_sets", "gradient_lengths")
    class OutputFidelityEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    N_LAYERS_FIELD_NUMBER: _ClassVar[int]
    N_HEADS_FIELD_NUMBER: _ClassVar[int]
    D_MODEL_FIELD_NUMBER: _ClassVar[int]
    MAX_SEQ_LEN_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    CONFIG_JSON_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_TOKENS_FIELD_NUMBER: _ClassVar[int]
    BOS_ID_FIELD_NUMBER: _ClassVar[int]
    PAD_ID_FIELD_NUMBER: _ClassVar[int]
    PRECISION_FIELD_NUMBER: _ClassVar[int]
    N_KV_HEADS_FIELD_NUMBER: _ClassVar[int]
    KV_HEADS_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_BYTES_FIELD_NUMBER: _ClassVar[int]
    RESIDENT_WEIGHT_BYTES_FIELD_NUMBER: _ClassVar[int]
    ATTENTION_MAX_ABS_DIFF_FIELD_NUMBER: _ClassVar[int]
    EMBEDDING_COSINE_MIN_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIDELITY_FIELD_NUMBER: _ClassVar[int]
    FIDELITY_SCOPE_FIELD_NUMBER: _ClassVar[int]
    SAES_FIELD_NUMBER: _ClassVar[int]
    GENERATES_FIELD_NUMBER: _ClassVar[int]
    CHAT_TEMPLATE_FIELD_NUMBER: _ClassVar[int]
    EOS_ID_FIELD_NUMBER: _ClassVar[int]
    TRANSCODER_SETS_FIELD_NUMBER: _ClassVar[int]
    GRADIENT_LENGTHS_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: str
    n_layers: int
    n_heads: int
    d_model: int
    max_seq_len: int
    vocab_size: int
    tokenizer: str
    provider: str
    config_json: str
    max_message_bytes: int
    max_batch_tokens: int
    bos_id: int
    pad_id: int
    precision: str
    n_kv_heads: int
    kv_heads: _containers.RepeatedScalarFieldContainer[int]
    weight_bytes: int
    resident_weight_bytes: int
    attention_max_abs_diff: float
    embedding_cosine_min: float
    output_fidelity: _containers.ScalarMap[str, float]
    fidelity_scope: str
    saes: _containers.RepeatedCompositeFieldContainer[SAEInfo]
    generates: bool
    chat_template: bool
    eos_id: int
    transcoder_sets: _containers.RepeatedScalarFieldContainer[str]
    gradient_lengths: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, name: _Optional[str] = ..., version: _Optional[str] = ..., n_layers: _Optional[int] = ..., n_heads: _Optional[int] = ..., d_model: _Optional[int] = ..., max_seq_len: _Optional[int] = ..., vocab_size: _Optional[int] = ..., tokenizer: _Optional[str] = ..., provider: _Optional[str] = ..., config_json: _Optional[str] = ..., max_message_bytes: _Optional[int] = ..., max_batch_tokens: _Optional[int] = ..., bos_id: _Optional[int] = ..., pad_id: _Optional[int] = ..., precision: _Optional[str] = ..., n_kv_heads: _Optional[int] = ..., kv_heads: _Optional[_Iterable[int]] = ..., weight_bytes: _Optional[int] = ..., resident_weight_bytes: _Optional[int] = ..., attention_max_abs_diff: _Optional[float] = ..., embedding_cosine_min: _Optional[float] = ..., output_fidelity: _Optional[_Mapping[str, float]] = ..., fidelity_scope: _Optional[str] = ..., saes: _Optional[_Iterable[_Union[SAEInfo, _Mapping]]] = ..., generates: _Optional[bool] = ..., chat_template: _Optional[bool] = ..., eos_id: _Optional[int] = ..., transcoder_sets: _Optional[_Iterable[str]] = ..., gradient_lengths: _Optional[_Iterable[int]] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("model", "prompt", "options")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    model: str
    prompt: Input
    options: GenerateOptions
    def __init__(self, model: _Optional[str] = ..., prompt: _Optional[_Union[Input, _Mapping]] = ..., options: _Optional[_Union[GenerateOptions, _Mapping]] = ...) -> None: ...

class GenerateOptions(_message.Message):
    __slots__ = ("max_tokens", "temperature", "top_p", "seed", "stop", "stop_token_ids", "ignore_eos", "logprobs", "interventions", "compare")
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    IGNORE_EOS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    INTERVENTIONS_FIELD_NUMBER: _ClassVar[int]
    COMPARE_FIELD_NUMBER: _ClassVar[int]
    max_tokens: int
    temperature: float
    top_p: float
    seed: int
    stop: _containers.RepeatedScalarFieldContainer[str]
    stop_token_ids: _containers.RepeatedScalarFieldContainer[int]
    ignore_eos: bool
    logprobs: int
    interventions: _containers.RepeatedCompositeFieldContainer[Intervention]
    compare: bool
    def __init__(self, max_tokens: _Optional[int] = ..., temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., seed: _Optional[int] = ..., stop: _Optional[_Iterable[str]] = ..., stop_token_ids: _Optional[_Iterable[int]] = ..., ignore_eos: _Optional[bool] = ..., logprobs: _Optional[int] = ..., interventions: _Optional[_Iterable[_Union[Intervention, _Mapping]]] = ..., compare: _Optional[bool] = ...) -> None: ...

class TokenLogprob(_message.Message):
    __slots__ = ("token_id", "logprob")
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    token_id: int
    logprob: float
    def __init__(self, token_id: _Optional[int] = ..., logprob: _Optional[float] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("choice", "token_id", "text", "logprob", "top_logprobs", "finish_reason", "prompt_tokens")
    CHOICE_FIELD_NUMBER: _ClassVar[int]
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    choice: int
    token_id: int
    text: str
    logprob: float
    top_logprobs: _containers.RepeatedCompositeFieldContainer[TokenLogprob]
    finish_reason: FinishReason
    prompt_tokens: int
    def __init__(self, choice: _Optional[int] = ..., token_id: _Optional[int] = ..., text: _Optional[str] = ..., logprob: _Optional[float] = ..., top_logprobs: _Optional[_Iterable[_Union[TokenLogprob, _Mapping]]] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ..., prompt_tokens: _Optional[int] = ...) -> None: ...

class GraphRequest(_message.Message):
    __slots__ = ("model", "prompt", "transcoders", "max_n_logits", "desired_logit_prob", "max_feature_nodes", "batch_size", "node_threshold", "edge_threshold", "slug", "include_adjacency", "update_interval", "top_logits")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    TRANSCODERS_FIELD_NUMBER: _ClassVar[int]
    MAX_N_LOGITS_FIELD_NUMBER: _ClassVar[int]
    DESIRED_LOGIT_PROB_FIELD_NUMBER: _ClassVar[int]
    MAX_FEATURE_NODES_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    NODE_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    EDGE_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    SLUG_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_ADJACENCY_FIELD_NUMBER: _ClassVar[int]
    UPDATE_INTERVAL_FIELD_NUMBER: _ClassVar[int]
    TOP_LOGITS_FIELD_NUMBER: _ClassVar[int]
    model: str
    prompt: Input
    transcoders: str
    max_n_logits: int
    desired_logit_prob: float
    max_feature_nodes: int
    batch_size: int
    node_threshold: float
    edge_threshold: float
    slug: str
    include_adjacency: bool
    update_interval: int
    top_logits: int
    def __init__(self, model: _Optional[str] = ..., prompt: _Optional[_Union[Input, _Mapping]] = ..., transcoders: _Optional[str] = ..., max_n_logits: _Optional[int] = ..., desired_logit_prob: _Optional[float] = ..., max_feature_nodes: _Optional[int] = ..., batch_size: _Optional[int] = ..., node_threshold: _Optional[float] = ..., edge_threshold: _Optional[float] = ..., slug: _Optional[str] = ..., include_adjacency: _Optional[bool] = ..., update_interval: _Optional[int] = ..., top_logits: _Optional[int] = ...) -> None: ...

class GraphProgress(_message.Message):
    __slots__ = ("rows", "total")
    ROWS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    rows: int
    total: int
    def __init__(self, rows: _Optional[int] = ..., total: _Optional[int] = ...) -> None: ...

class GraphResult(_message.Message):
    __slots__ = ("graph_json", "replacement_score", "completeness_score", "adjacency_json")
    GRAPH_JSON_FIELD_NUMBER: _ClassVar[int]
    REPLACEMENT_SCORE_FIELD_NUMBER: _ClassVar[int]
    COMPLETENESS_SCORE_FIELD_NUMBER: _ClassVar[int]
    ADJACENCY_JSON_FIELD_NUMBER: _ClassVar[int]
    graph_json: str
    replacement_score: float
    completeness_score: float
    adjacency_json: str
    def __init__(self, graph_json: _Optional[str] = ..., replacement_score: _Optional[float] = ..., completeness_score: _Optional[float] = ..., adjacency_json: _Optional[str] = ...) -> None: ...

class GraphResponse(_message.Message):
    __slots__ = ("progress", "result")
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    progress: GraphProgress
    result: GraphResult
    def __init__(self, progress: _Optional[_Union[GraphProgress, _Mapping]] = ..., result: _Optional[_Union[GraphResult, _Mapping]] = ...) -> None: ...
