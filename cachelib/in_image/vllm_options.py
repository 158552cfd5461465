# ruff: noqa: E501
"""vLLM 0.32.0's command-line options and the environment variables its compile key reads (generated).

Written by ``tests/vllm/options_table.py`` from vLLM's own parser and configuration hashing (see there);
:mod:`cachelib.in_image.vllmargs` reads it. Standard library only, like its reader.
"""

from __future__ import annotations

from typing import NamedTuple

VLLM_VERSION = '0.32.0'
"""The vLLM whose parser and hashing this table was written from."""


class Option(NamedTuple):
    names: tuple[str, ...]
    """Every spelling of the option (``--enable-prefix-caching``, ``--no-enable-prefix-caching``, ``-tp``)."""
    takes: str
    """``flag`` (no value), ``one``, ``many`` or ``optional`` (a value or none)."""
    default: str | None
    """The default as a command line writes it (None: none, or not writable)."""
    key: bool
    """Whether another value changes vLLM's compile key."""


OPTIONS: tuple[Option, ...] = (
    Option(('--api-server-count', '-asc'), 'one', None, False),  # frontend
    Option(('--grpc',), 'flag', 'false', False),  # frontend
    Option(('--lora-modules',), 'many', None, False),  # frontend
    Option(('--chat-template',), 'one', None, False),  # frontend
    Option(('--chat-template-content-format',), 'one', 'auto', False),  # frontend
    Option(('--trust-request-chat-template', '--no-trust-request-chat-template'), 'flag', 'false', False),  # frontend
    Option(('--trust-request-mm-kwargs', '--no-trust-request-mm-kwargs'), 'flag', 'false', False),  # frontend
    Option(('--default-chat-template-kwargs',), 'one', None, False),  # frontend
    Option(('--response-role',), 'one', 'assistant', False),  # frontend
    Option(('--return-tokens-as-token-ids', '--no-return-tokens-as-token-ids'), 'flag', 'false', False),  # frontend
    Option(('--enable-auto-tool-choice', '--no-enable-auto-tool-choice'), 'flag', 'false', False),  # frontend
    Option(('--exclude-tools-when-tool-choice-none', '--no-exclude-tools-when-tool-choice-none'), 'flag', 'false', False),  # frontend
    Option(('--tool-call-parser',), 'one', None, False),  # frontend
    Option(('--tool-parser-plugin',), 'one', '', False),  # frontend
    Option(('--tool-strict-level',), 'one', 'auto', False),  # frontend
    Option(('--tool-server',), 'one', None, False),  # frontend
    Option(('--max-log-len',), 'one', None, False),  # frontend
    Option(('--enable-prompt-tokens-details', '--no-enable-prompt-tokens-details'), 'flag', 'false', False),  # frontend
    Option(('--enable-per-request-metrics', '--no-enable-per-request-metrics'), 'flag', 'false', False),  # frontend
    Option(('--enable-server-load-tracking', '--no-enable-server-load-tracking'), 'flag', 'false', False),  # frontend
    Option(('--enable-force-include-usage', '--no-enable-force-include-usage'), 'flag', 'false', False),  # frontend
    Option(('--sse-keep-alive-interval',), 'one', '0', False),  # frontend
    Option(('--enable-tokenizer-info-endpoint', '--no-enable-tokenizer-info-endpoint'), 'flag', 'false', False),  # frontend
    Option(('--enable-log-outputs', '--no-enable-log-outputs'), 'flag', 'false', False),  # frontend
    Option(('--enable-log-deltas', '--no-enable-log-deltas'), 'flag', 'true', False),  # frontend
    Option(('--cohere-is-reasoning-model', '--no-cohere-is-reasoning-model'), 'flag', 'true', False),  # frontend
    Option(('--cohere-format',), 'one', 'cmd4', False),  # frontend
    Option(('--anthropic-disabled-thinking-effort',), 'one', 'auto', False),  # frontend
    Option(('--log-error-stack', '--no-log-error-stack'), 'flag', 'false', False),  # frontend
    Option(('--tokens-only', '--no-tokens-only'), 'flag', 'false', False),  # probed
    Option(('--enable-scale-out', '--no-enable-scale-out'), 'flag', 'false', False),  # frontend
    Option(('--fingerprint-mode',), 'one', 'full', False),  # frontend
    Option(('--fingerprint-value',), 'one', None, False),  # frontend
    Option(('--host',), 'one', None, False),  # frontend
    Option(('--port',), 'one', '8000', False),  # frontend
    Option(('--grpc-port',), 'one', None, False),  # frontend
    Option(('--data-parallel-supervisor-port',), 'one', '9256', False),  # frontend
    Option(('--dp-supervisor-probe-interval-s',), 'one', '5.0', False),  # frontend
    Option(('--dp-supervisor-probe-timeout-s',), 'one', '5.0', False),  # frontend
    Option(('--dp-supervisor-probe-failure-threshold',), 'one', '3', False),  # frontend
    Option(('--uds',), 'one', None, False),  # frontend
    Option(('--uvicorn-log-level',), 'one', 'info', False),  # frontend
    Option(('--disable-uvicorn-access-log', '--no-disable-uvicorn-access-log'), 'flag', 'false', False),  # frontend
    Option(('--disable-access-log-for-endpoints',), 'one', None, False),  # frontend
    Option(('--allow-credentials', '--no-allow-credentials'), 'flag', 'false', False),  # frontend
    Option(('--allowed-origins',), 'one', '[]', False),  # frontend
    Option(('--allowed-methods',), 'one', '["*"]', False),  # frontend
    Option(('--allowed-headers',), 'one', '["*"]', False),  # frontend
    Option(('--api-key',), 'many', None, False),  # frontend
    Option(('--ssl-keyfile',), 'one', None, False),  # frontend
    Option(('--ssl-certfile',), 'one', None, False),  # frontend
    Option(('--ssl-ca-certs',), 'one', None, False),  # frontend
    Option(('--enable-ssl-refresh', '--no-enable-ssl-refresh'), 'flag', 'false', False),  # frontend
    Option(('--ssl-cert-reqs',), 'one', '0', False),  # frontend
    Option(('--ssl-ciphers',), 'one', None, False),  # frontend
    Option(('--root-path',), 'one', None, False),  # frontend
    Option(('--middleware',), 'one', '[]', False),  # frontend
    Option(('--enable-request-id-headers', '--no-enable-request-id-headers'), 'flag', 'false', False),  # frontend
    Option(('--disable-fastapi-docs', '--no-disable-fastapi-docs'), 'flag', 'false', False),  # frontend
    Option(('--h11-max-incomplete-event-size',), 'one', '4194304', False),  # frontend
    Option(('--h11-max-header-count',), 'one', '256', False),  # frontend
    Option(('--enable-offline-docs', '--no-enable-offline-docs'), 'flag', 'false', False),  # frontend
    Option(('--enable-flash-late-interaction', '--no-enable-flash-late-interaction'), 'flag', 'true', False),  # frontend
    Option(('--runner',), 'one', 'auto', True),  # probed
    Option(('--convert',), 'one', 'auto', True),  # probed
    Option(('--tokenizer',), 'one', None, False),  # ignored
    Option(('--tokenizer-mode',), 'one', 'auto', False),  # probed
    Option(('--trust-remote-code', '--no-trust-remote-code'), 'flag', 'false', True),  # probed
    Option(('--dtype',), 'one', 'auto', True),  # probed
    Option(('--seed',), 'one', '0', False),  # probed
    Option(('--hf-config-path',), 'one', None, False),  # ignored
    Option(('--allowed-local-media-path',), 'one', '', False),  # probed
    Option(('--allowed-media-domains',), 'many', None, False),  # probed
    Option(('--revision',), 'one', None, True),  # probed
    Option(('--code-revision',), 'one', None, True),  # probed
    Option(('--tokenizer-revision',), 'one', None, False),  # probed
    Option(('--max-model-len',), 'one', None, True),  # probed
    Option(('--quantization', '-q'), 'one', None, True),  # unprobed
    Option(('--quantization-config',), 'one', None, True),  # configuration
    Option(('--allow-deprecated-quantization', '--no-allow-deprecated-quantization'), 'flag', 'false', True),  # probed
    Option(('--enforce-eager', '--no-enforce-eager'), 'flag', 'false', True),  # probed
    Option(('--enable-return-routed-experts', '--no-enable-return-routed-experts'), 'flag', 'false', True),  # unprobed
    Option(('--return-sampling-mask', '--no-return-sampling-mask'), 'flag', 'false', False),  # ignored
    Option(('--max-logprobs',), 'one', '20', True),  # probed
    Option(('--logprobs-mode',), 'one', 'raw_logprobs', False),  # probed
    Option(('--use-fp64-gumbel', '--no-use-fp64-gumbel'), 'flag', 'false', False),  # probed
    Option(('--enable-trace-replay', '--no-enable-trace-replay'), 'flag', 'false', False),  # ignored
    Option(('--disable-sliding-window', '--no-disable-sliding-window'), 'flag', 'false', True),  # probed
    Option(('--disable-cascade-attn', '--no-disable-cascade-attn'), 'flag', None, False),  # probed
    Option(('--skip-tokenizer-init', '--no-skip-tokenizer-init'), 'flag', 'false', False),  # probed
    Option(('--enable-prompt-embeds', '--no-enable-prompt-embeds'), 'flag', 'false', True),  # probed
    Option(('--served-model-name',), 'many', None, False),  # probed
    Option(('--config-format',), 'one', 'auto', False),  # probed
    Option(('--hf-token',), 'optional', None, False),  # probed
    Option(('--hf-overrides',), 'one', '{}', False),  # probed
    Option(('--model-class-overrides',), 'one', '{}', False),  # probed
    Option(('--pooler-config',), 'one', None, True),  # configuration
    Option(('--generation-config',), 'one', 'auto', True),  # configuration
    Option(('--override-generation-config',), 'one', '{}', True),  # configuration
    Option(('--enable-sleep-mode', '--no-enable-sleep-mode'), 'flag', 'false', True),  # unprobed
    Option(('--sleep-mode-offload-cudagraph', '--no-sleep-mode-offload-cudagraph'), 'flag', 'false', True),  # probed
    Option(('--sleep-preserve-parameter-names',), 'many', '[]', True),  # probed
    Option(('--enable-cumem-allocator', '--no-enable-cumem-allocator'), 'flag', 'false', True),  # unprobed
    Option(('--enable-nccl-comm-suspend', '--no-enable-nccl-comm-suspend'), 'flag', 'false', True),  # probed
    Option(('--model-impl',), 'one', 'auto', True),  # probed
    Option(('--logits-processors',), 'many', None, False),  # probed
    Option(('--io-processor-plugin',), 'one', None, False),  # probed
    Option(('--renderer-num-workers',), 'one', '1', True),  # probed
    Option(('--load-format',), 'one', 'auto', False),  # probed
    Option(('--download-dir',), 'one', None, False),  # probed
    Option(('--safetensors-load-strategy',), 'one', None, False),  # probed
    Option(('--safetensors-prefetch-num-threads',), 'one', '8', False),  # probed
    Option(('--safetensors-prefetch-block-size',), 'one', '16777216', False),  # probed
    Option(('--model-loader-extra-config',), 'one', '{}', True),  # configuration
    Option(('--ignore-patterns',), 'many', '["original/**/*"]', False),  # probed
    Option(('--use-tqdm-on-load', '--no-use-tqdm-on-load'), 'flag', 'true', False),  # probed
    Option(('--pt-load-map-location',), 'one', 'cpu', False),  # probed
    Option(('--attention-backend',), 'one', None, False),  # probed
    Option(('--mamba-backend',), 'one', None, True),  # unprobed
    Option(('--mamba-ssu-algorithm',), 'one', None, True),  # unprobed
    Option(('--enable-mamba-cache-stochastic-rounding', '--no-enable-mamba-cache-stochastic-rounding'), 'flag', 'false', True),  # unprobed
    Option(('--mamba-cache-philox-rounds',), 'one', '0', False),  # probed
    Option(('--reasoning-parser',), 'one', '', True),  # unprobed
    Option(('--reasoning-parser-plugin',), 'one', '', False),  # probed
    Option(('--distributed-executor-backend',), 'one', None, False),  # probed
    Option(('--pipeline-parallel-size', '-pp'), 'one', '1', True),  # probed
    Option(('--master-addr',), 'one', '127.0.0.1', False),  # probed
    Option(('--master-port',), 'one', '29501', False),  # probed
    Option(('--nnodes', '-n'), 'one', '1', False),  # probed
    Option(('--node-rank', '-r'), 'one', '0', False),  # probed
    Option(('--distributed-timeout-seconds',), 'one', None, True),  # probed
    Option(('--cpu-distributed-timeout-seconds',), 'one', None, True),  # probed
    Option(('--numa-bind', '--no-numa-bind'), 'flag', 'false', False),  # probed
    Option(('--numa-bind-nodes',), 'many', None, False),  # ignored
    Option(('--numa-bind-cpus',), 'many', None, False),  # ignored
    Option(('--device-ids',), 'one', None, False),  # probed
    Option(('--tensor-parallel-size', '-tp'), 'one', '1', True),  # probed
    Option(('--decode-context-parallel-size', '-dcp'), 'one', '1', False),  # probed
    Option(('--dcp-comm-backend',), 'one', None, True),  # probed
    Option(('--dcp-q-replicate', '--no-dcp-q-replicate'), 'flag', None, True),  # probed
    Option(('--dcp-kv-cache-interleave-size',), 'one', '1', True),  # probed
    Option(('--cp-kv-cache-interleave-size',), 'one', None, True),  # probed
    Option(('--prefill-context-parallel-size', '-pcp'), 'one', '1', False),  # probed
    Option(('--data-parallel-size', '-dp'), 'one', '1', True),  # probed
    Option(('--data-parallel-rank', '-dpn'), 'one', None, False),  # ignored
    Option(('--data-parallel-start-rank', '-dpr'), 'one', None, False),  # probed
    Option(('--data-parallel-size-local', '-dpl'), 'one', None, False),  # probed
    Option(('--data-parallel-address', '-dpa'), 'one', None, False),  # probed
    Option(('--data-parallel-rpc-port', '-dpp'), 'one', None, False),  # probed
    Option(('--data-parallel-backend', '-dpb'), 'one', 'mp', False),  # probed
    Option(('--data-parallel-hybrid-lb', '--no-data-parallel-hybrid-lb', '-dph'), 'flag', 'false', False),  # ignored
    Option(('--data-parallel-external-lb', '--no-data-parallel-external-lb', '-dpe'), 'flag', 'false', False),  # ignored
    Option(('--data-parallel-multi-port-external-lb', '-dpm'), 'flag', 'false', False),  # probed
    Option(('--enable-hc-sp', '--no-enable-hc-sp'), 'flag', 'false', True),  # probed
    Option(('--enable-expert-parallel', '--no-enable-expert-parallel', '-ep'), 'flag', 'false', True),  # unprobed
    Option(('--enable-batch-sharded-sampling', '--no-enable-batch-sharded-sampling'), 'flag', None, True),  # unprobed
    Option(('--enable-ep-weight-filter', '--no-enable-ep-weight-filter'), 'flag', 'false', True),  # probed
    Option(('--all2all-backend',), 'one', 'allgather_reducescatter', True),  # probed
    Option(('--enable-dbo', '--no-enable-dbo'), 'flag', 'false', False),  # probed
    Option(('--enable-shm-tensor-arena', '--no-enable-shm-tensor-arena'), 'flag', 'false', False),  # probed
    Option(('--ubatch-size',), 'one', '0', True),  # probed
    Option(('--enable-elastic-ep', '--no-enable-elastic-ep'), 'flag', 'false', True),  # unprobed
    Option(('--elastic-ep-max-dp-size',), 'one', None, False),  # probed
    Option(('--dbo-decode-token-threshold',), 'one', '32', True),  # probed
    Option(('--dp-sync-interval',), 'one', '16', True),  # probed
    Option(('--dbo-prefill-token-threshold',), 'one', '512', True),  # probed
    Option(('--disable-nccl-for-dp-synchronization', '--no-disable-nccl-for-dp-synchronization'), 'flag', None, False),  # probed
    Option(('--enable-eplb', '--no-enable-eplb'), 'flag', 'false', True),  # unprobed
    Option(('--eplb-config',), 'one', None, True),  # configuration
    Option(('--expert-placement-strategy',), 'one', 'linear', True),  # probed
    Option(('--max-parallel-loading-workers',), 'one', None, False),  # probed
    Option(('--ray-workers-use-nsight', '--no-ray-workers-use-nsight'), 'flag', 'false', False),  # ignored
    Option(('--disable-custom-all-reduce', '--no-disable-custom-all-reduce'), 'flag', 'false', False),  # probed
    Option(('--worker-cls',), 'one', 'auto', False),  # probed
    Option(('--worker-extension-cls',), 'one', '', False),  # probed
    Option(('--enable-fault-tolerance', '--no-enable-fault-tolerance'), 'flag', 'false', True),  # unprobed
    Option(('--fault-tolerance-config',), 'one', None, True),  # configuration
    Option(('--block-size',), 'one', None, True),  # probed
    Option(('--gpu-memory-utilization', '--device-memory-utilization'), 'one', '0.92', False),  # probed
    Option(('--kv-cache-memory-bytes',), 'one', None, False),  # probed
    Option(('--kv-cache-dtype',), 'one', 'auto', True),  # probed
    Option(('--num-gpu-blocks-override',), 'one', None, False),  # probed
    Option(('--enable-prefix-caching', '--no-enable-prefix-caching'), 'flag', None, False),  # probed
    Option(('--prefix-caching-hash-algo',), 'one', 'sha256', False),  # probed
    Option(('--prefix-cache-retention-interval',), 'one', '0', False),  # probed
    Option(('--kv-cache-dtype-skip-layers',), 'many', '[]', True),  # probed
    Option(('--kv-sharing-fast-prefill', '--no-kv-sharing-fast-prefill'), 'flag', 'false', False),  # probed
    Option(('--swa-bounded-replay', '--no-swa-bounded-replay'), 'flag', 'true', False),  # probed
    Option(('--mamba-cache-dtype',), 'one', 'auto', True),  # probed
    Option(('--mamba-ssm-cache-dtype',), 'one', 'auto', True),  # probed
    Option(('--mamba-block-size',), 'one', None, True),  # probed
    Option(('--prefix-match-unit',), 'one', None, False),  # probed
    Option(('--mamba-cache-mode',), 'one', 'none', True),  # probed
    Option(('--enable-mamba-shared-prefix-checkpoint', '--no-enable-mamba-shared-prefix-checkpoint'), 'flag', 'false', False),  # probed
    Option(('--replayssm-buffer-len',), 'one', '16', True),  # probed
    Option(('--use-replayssm', '--no-use-replayssm'), 'flag', 'false', True),  # unprobed
    Option(('--kv-offloading-size',), 'one', None, True),  # probed
    Option(('--kv-offloading-backend',), 'one', 'native', True),  # probed
    Option(('--offload-backend',), 'one', 'auto', True),  # probed
    Option(('--cpu-offload-gb',), 'one', '0', True),  # probed
    Option(('--cpu-offload-params',), 'many', None, True),  # probed
    Option(('--offload-group-size',), 'one', '0', True),  # probed
    Option(('--offload-num-in-group',), 'one', '1', True),  # probed
    Option(('--offload-prefetch-step',), 'one', '1', True),  # probed
    Option(('--offload-params',), 'many', None, True),  # probed
    Option(('--language-model-only', '--no-language-model-only'), 'flag', 'false', False),  # probed
    Option(('--limit-mm-per-prompt',), 'one', '{}', False),  # probed
    Option(('--enable-mm-embeds', '--no-enable-mm-embeds'), 'flag', 'false', False),  # probed
    Option(('--media-io-kwargs',), 'one', '{}', False),  # probed
    Option(('--mm-processor-kwargs',), 'one', None, False),  # probed
    Option(('--mm-processor-cache-gb',), 'one', '4', False),  # probed
    Option(('--mm-processor-cache-type',), 'one', 'lru', False),  # probed
    Option(('--mm-hasher-algorithm',), 'one', 'blake3', False),  # probed
    Option(('--mm-shm-cache-max-object-size-mb',), 'one', '128', False),  # probed
    Option(('--mm-encoder-only', '--no-mm-encoder-only'), 'flag', 'false', False),  # probed
    Option(('--mm-encoder-tp-mode',), 'one', 'weights', False),  # probed
    Option(('--mm-encoder-attn-backend',), 'one', None, False),  # probed
    Option(('--mm-encoder-attn-dtype',), 'one', None, False),  # probed
    Option(('--mm-encoder-fp8-scale-path',), 'one', None, False),  # probed
    Option(('--mm-encoder-fp8-scale-save-path',), 'one', None, False),  # probed
    Option(('--mm-encoder-fp8-scale-save-margin',), 'one', '1.5', False),  # probed
    Option(('--interleave-mm-strings', '--no-interleave-mm-strings'), 'flag', 'false', False),  # probed
    Option(('--skip-mm-profiling', '--no-skip-mm-profiling'), 'flag', 'false', False),  # probed
    Option(('--video-pruning-rate',), 'one', None, False),  # probed
    Option(('--video-pruning-method',), 'one', 'evs', False),  # probed
    Option(('--mm-tensor-ipc',), 'one', 'direct_rpc', False),  # probed
    Option(('--mm-processor-device',), 'one', 'auto', False),  # probed
    Option(('--mm-ipc-gpu-memory-gb',), 'one', '0', False),  # probed
    Option(('--mm-device-do-normalize', '--no-mm-device-do-normalize'), 'flag', None, False),  # probed
    Option(('--enable-lora', '--no-enable-lora'), 'flag', None, True),  # probed
    Option(('--max-loras',), 'one', '1', False),  # probed
    Option(('--max-lora-rank',), 'one', '16', False),  # probed
    Option(('--lora-dtype',), 'one', 'auto', False),  # probed
    Option(('--enable-tower-connector-lora', '--no-enable-tower-connector-lora'), 'flag', 'false', False),  # probed
    Option(('--max-cpu-loras',), 'one', None, False),  # probed
    Option(('--fully-sharded-loras', '--no-fully-sharded-loras'), 'flag', 'false', False),  # probed
    Option(('--lora-target-modules',), 'many', None, False),  # probed
    Option(('--default-mm-loras',), 'one', None, False),  # probed
    Option(('--specialize-active-lora', '--no-specialize-active-lora'), 'flag', 'false', False),  # probed
    Option(('--enable-mixed-moe-lora-format', '--no-enable-mixed-moe-lora-format'), 'flag', 'false', False),  # probed
    Option(('--enable-moe-shared-loras', '--no-enable-moe-shared-loras'), 'flag', 'false', False),  # probed
    Option(('--max-lora-cls-labels',), 'one', None, False),  # probed
    Option(('--logging-config',), 'one', '==SUPPRESS==', True),  # configuration
    Option(('--log-level',), 'one', '==SUPPRESS==', False),  # probed
    Option(('--log-config-file',), 'one', '==SUPPRESS==', True),  # unprobed
    Option(('--show-hidden-metrics-for-version',), 'one', None, False),  # probed
    Option(('--otlp-traces-endpoint',), 'one', None, False),  # probed
    Option(('--collect-detailed-traces',), 'many', None, True),  # unprobed
    Option(('--per-request-spec-decode-metrics',), 'one', 'none', False),  # probed
    Option(('--kv-cache-metrics', '--no-kv-cache-metrics'), 'flag', 'false', False),  # probed
    Option(('--kv-cache-metrics-sample',), 'one', '0.01', False),  # probed
    Option(('--custom-histogram-buckets',), 'one', None, False),  # probed
    Option(('--cudagraph-metrics', '--no-cudagraph-metrics'), 'flag', 'false', False),  # probed
    Option(('--enable-layerwise-nvtx-tracing', '--no-enable-layerwise-nvtx-tracing'), 'flag', 'false', False),  # probed
    Option(('--enable-mfu-metrics', '--no-enable-mfu-metrics'), 'flag', 'false', False),  # probed
    Option(('--enable-logging-iteration-details', '--no-enable-logging-iteration-details'), 'flag', 'false', False),  # probed
    Option(('--jit-monitor-mode',), 'one', 'warn', False),  # probed
    Option(('--jit-monitor-verbose', '--no-jit-monitor-verbose'), 'flag', 'false', False),  # probed
    Option(('--max-num-batched-tokens',), 'one', None, True),  # probed
    Option(('--max-num-scheduled-tokens',), 'one', None, False),  # probed
    Option(('--max-num-seqs',), 'one', None, True),  # probed
    Option(('--max-num-active-seqs',), 'one', None, False),  # probed
    Option(('--max-num-queued-reqs',), 'one', None, False),  # probed
    Option(('--max-num-queued-tokens',), 'one', None, False),  # probed
    Option(('--long-prefill-token-threshold',), 'one', '0', False),  # probed
    Option(('--long-prefill-token-threshold-adaptive', '--no-long-prefill-token-threshold-adaptive'), 'flag', 'false', False),  # probed
    Option(('--scheduling-policy',), 'one', 'fcfs', False),  # probed
    Option(('--enable-chunked-prefill', '--no-enable-chunked-prefill'), 'flag', None, False),  # probed
    Option(('--disable-chunked-mm-input', '--no-disable-chunked-mm-input'), 'flag', 'false', False),  # probed
    Option(('--scheduler-cls',), 'one', None, False),  # probed
    Option(('--scheduler-reserve-full-isl', '--no-scheduler-reserve-full-isl'), 'flag', 'true', False),  # probed
    Option(('--watermark',), 'one', '0.0', False),  # probed
    Option(('--prefill-schedule-interval',), 'one', '1', False),  # probed
    Option(('--disable-hybrid-kv-cache-manager', '--no-disable-hybrid-kv-cache-manager'), 'flag', None, False),  # probed
    Option(('--async-scheduling', '--no-async-scheduling'), 'flag', None, False),  # probed
    Option(('--stream-interval',), 'one', '1', False),  # probed
    Option(('--cudagraph-capture-sizes',), 'many', None, False),  # probed
    Option(('--max-cudagraph-capture-size',), 'one', None, True),  # probed
    Option(('--ir-op-priority',), 'one', None, False),  # probed
    Option(('--enable-flashinfer-autotune', '--no-enable-flashinfer-autotune'), 'flag', None, False),  # probed
    Option(('--moe-backend',), 'one', 'auto', True),  # probed
    Option(('--linear-backend',), 'one', 'auto', True),  # probed
    Option(('--sparse-indexer-topk-backend',), 'one', 'auto', True),  # probed
    Option(('--speculative-config', '-sc'), 'one', None, True),  # configuration
    Option(('--spec-method',), 'one', None, True),  # unprobed
    Option(('--spec-model',), 'one', None, True),  # unprobed
    Option(('--spec-tokens',), 'one', None, True),  # unprobed
    Option(('--watermark-config',), 'one', None, True),  # configuration
    Option(('--diffusion-config', '-dc'), 'one', None, True),  # configuration
    Option(('--kv-transfer-config',), 'one', None, True),  # configuration
    Option(('--kv-events-config',), 'one', None, True),  # configuration
    Option(('--ec-transfer-config',), 'one', None, True),  # configuration
    Option(('--ec-manager-config',), 'one', None, True),  # configuration
    Option(('--compilation-config', '-cc'), 'one', None, True),  # configuration
    Option(('--attention-config', '-ac'), 'one', None, True),  # configuration
    Option(('--engram-config',), 'one', None, True),  # configuration
    Option(('--reasoning-config',), 'one', None, True),  # configuration
    Option(('--kernel-config',), 'one', None, True),  # configuration
    Option(('--additional-config',), 'one', '{}', True),  # configuration
    Option(('--structured-outputs-config',), 'one', None, True),  # configuration
    Option(('--aux-output-config',), 'one', None, True),  # configuration
    Option(('--profiler-config',), 'one', None, True),  # configuration
    Option(('--optimization-level',), 'one', '2', True),  # configuration
    Option(('--performance-mode',), 'one', 'balanced', False),  # probed
    Option(('--weight-transfer-config',), 'one', None, True),  # configuration
    Option(('--disable-log-stats',), 'flag', 'false', False),  # probed
    Option(('--aggregate-engine-logging',), 'flag', 'false', False),  # probed
    Option(('--fail-on-environ-validation', '--no-fail-on-environ-validation'), 'flag', 'false', False),  # probed
    Option(('--shutdown-timeout',), 'one', '0', False),  # probed
    Option(('--gdn-prefill-backend',), 'one', None, True),  # probed
    Option(('--kda-prefill-backend',), 'one', None, True),  # probed
    Option(('--kda-decode-backend',), 'one', None, True),  # probed
    Option(('--enable-log-requests', '--no-enable-log-requests'), 'flag', 'false', False),  # probed
)

HASHED_ENV: dict[str, str | None] = {
    'CMAKE_BUILD_TYPE': None,
    'CUDA_HOME': None,
    'MOONCAKE_PREFERRED_SEGMENT': None,
    'MOONCAKE_REQUESTER_LOCAL_HOSTNAME': None,
    'NVCC_THREADS': None,
    'RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES': None,
    'RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES': None,
    'RAY_EXPERIMENTAL_NOSET_HABANA_VISIBLE_MODULES': None,
    'RAY_EXPERIMENTAL_NOSET_HIP_VISIBLE_DEVICES': None,
    'RAY_EXPERIMENTAL_NOSET_NEURON_RT_VISIBLE_CORES': None,
    'RAY_EXPERIMENTAL_NOSET_ONEAPI_DEVICE_SELECTOR': None,
    'RAY_EXPERIMENTAL_NOSET_RBLN_RT_VISIBLE_DEVICES': None,
    'RAY_EXPERIMENTAL_NOSET_ROCR_VISIBLE_DEVICES': None,
    'RAY_EXPERIMENTAL_NOSET_TPU_VISIBLE_CHIPS': None,
    'VERBOSE': 'false',
    'VLLM_ADAPTIVE_VERIFICATION_PROFILE_CONTEXT_LEN': '8192',
    'VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE': 'true',
    'VLLM_ALLOW_INSECURE_SERIALIZATION': 'false',
    'VLLM_ALLOW_LONG_MAX_MODEL_LEN': 'false',
    'VLLM_ALLOW_RUNTIME_LORA_UPDATING': 'false',
    'VLLM_ALLREDUCE_USE_FLASHINFER': 'true',
    'VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC': 'false',
    'VLLM_ALLREDUCE_USE_SYMM_MEM': 'true',
    'VLLM_B12X_MOE_FP4_FORCE_A16': 'false',
    'VLLM_BATCH_INVARIANT': 'false',
    'VLLM_BLOCKSCALE_FP8_GEMM_FLASHINFER': 'true',
    'VLLM_BUILD_COMMIT': 'unknown',
    'VLLM_BUILD_PIPELINE': 'local',
    'VLLM_BUILD_URL': '',
    'VLLM_CHAT_TEMPLATE_RENDER_TIMEOUT': '30.0',
    'VLLM_COMPILE_CACHE_SAVE_FORMAT': 'binary',
    'VLLM_COMPUTE_NANS_IN_LOGITS': 'false',
    'VLLM_CONFIGURE_LOGGING': 'true',
    'VLLM_CPU_ATTN_SPLIT_KV': 'true',
    'VLLM_CPU_CI_ENV': 'false',
    'VLLM_CPU_INT4_W4A8': 'true',
    'VLLM_CPU_NUM_OF_RESERVED_CPU': None,
    'VLLM_CPU_OMP_THREADS_BIND': 'auto',
    'VLLM_CUDART_SO_PATH': None,
    'VLLM_CUSTOM_SCOPES_FOR_PROFILING': 'false',
    'VLLM_DBO_COMM_SMS': '20',
    'VLLM_DCP_Q_REPLICATE': 'false',
    'VLLM_DEBUG_MFU_METRICS': 'false',
    'VLLM_DEBUG_WORKSPACE': 'false',
    'VLLM_DEEPEPLL_NVFP4_DISPATCH': 'false',
    'VLLM_DEEPEP_BUFFER_SIZE_MB': '1024',
    'VLLM_DEEPEP_HIGH_THROUGHPUT_FORCE_INTRA_NODE': 'false',
    'VLLM_DEEPEP_LOW_LATENCY_USE_MNNVL': 'false',
    'VLLM_DEEPEP_V2_ALLOW_HYBRID_MODE': 'true',
    'VLLM_DEEPEP_V2_ALLOW_MULTIPLE_REDUCTION': 'false',
    'VLLM_DEEPEP_V2_PREFER_OVERLAP': 'false',
    'VLLM_DEEP_GEMM_WARMUP': 'relax',
    'VLLM_DISABLED_KERNELS': None,
    'VLLM_DISABLE_COMPILE_CACHE': 'false',
    'VLLM_DISABLE_DSV4_MEGAMOE_SHARED_EXPERT_FUSION': 'false',
    'VLLM_DISABLE_LOG_LOGO': 'false',
    'VLLM_DISABLE_PYNCCL': 'false',
    'VLLM_DISABLE_REQUEST_ID_RANDOMIZATION': 'false',
    'VLLM_DISABLE_SHARED_EXPERTS_STREAM': 'false',
    'VLLM_DISTRIBUTED_USE_SPLIT_GROUP': 'false',
    'VLLM_DOCKER_BUILD_CONTEXT': 'false',
    'VLLM_DP_RANK': '0',
    'VLLM_DP_RANK_LOCAL': '0',
    'VLLM_DP_SIZE': '1',
    'VLLM_EC_SIDE_CHANNEL_HOST': 'localhost',
    'VLLM_EC_SIDE_CHANNEL_PORT': '5601',
    'VLLM_ELASTIC_EP_DRAIN_REQUESTS': 'false',
    'VLLM_ENABLE_COHERE_API': 'false',
    'VLLM_ENABLE_CUDAGRAPH_GC': 'false',
    'VLLM_ENABLE_FLA_PACKED_RECURRENT_DECODE': 'true',
    'VLLM_ENABLE_GEMM_RS': 'false',
    'VLLM_ENABLE_HPC_OPS': 'false',
    'VLLM_ENABLE_INDUCTOR_COORDINATE_DESCENT_TUNING': 'true',
    'VLLM_ENABLE_INDUCTOR_MAX_AUTOTUNE': 'true',
    'VLLM_ENABLE_PREGRAD_PASSES': 'true',
    'VLLM_ENABLE_RESPONSES_API_STORE': 'false',
    'VLLM_ENFORCE_STRICT_TOOL_CALLING': 'true',
    'VLLM_ENGINE_READY_TIMEOUT_S': '600',
    'VLLM_FASTSAFETENSORS_QUEUE_SIZE': '0',
    'VLLM_FLASHINFER_ALLREDUCE_BACKEND': 'auto',
    'VLLM_FLASHINFER_MOE_A2A_LOW_PRECISION_COMBINE': 'false',
    'VLLM_FLASHINFER_WORKSPACE_BUFFER_SIZE': '413138944',
    'VLLM_FLOAT32_MATMUL_PRECISION': 'highest',
    'VLLM_GC_DEBUG': '',
    'VLLM_GDN_DECODE_KERNEL': 'cuda',
    'VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS': 'false',
    'VLLM_GPT_OSS_SYSTEM_TOOL_MCP_LABELS': None,
    'VLLM_GPU_NIC_PCIE_MAPPING': '',
    'VLLM_GPU_SYNC_CHECK': None,
    'VLLM_HAS_FLASHINFER_CUBIN': 'false',
    'VLLM_HUMMING_INPUT_QUANT_CONFIG': None,
    'VLLM_HUMMING_MOE_GEMM_TYPE': None,
    'VLLM_HUMMING_ONLINE_QUANT_CONFIG': None,
    'VLLM_HUMMING_USE_F16_ACCUM': 'false',
    'VLLM_IMAGE_TAG': '',
    'VLLM_KIMI_K3_AUX_ATTN_RES_STREAM': 'false',
    'VLLM_KIMI_K3_GEMM_AR': 'true',
    'VLLM_KIMI_K3_SHARD_SP_SHARED_EXPERT': 'false',
    'VLLM_KV_CACHE_LAYOUT': None,
    'VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES': 'true',
    'VLLM_KV_OFFLOAD_MAX_BATCH_DESCRIPTORS': '0',
    'VLLM_LOG_BATCHSIZE_INTERVAL': '-1.0',
    'VLLM_LOG_MODEL_INSPECTION': 'false',
    'VLLM_LOOPBACK_IP': '',
    'VLLM_LORA_DISABLE_PDL': 'false',
    'VLLM_LORA_ENABLE_DUAL_STREAM': 'false',
    'VLLM_LORA_RESOLVER_CACHE_DIR': None,
    'VLLM_LORA_RESOLVER_HF_REPO_LIST': None,
    'VLLM_MAIN_CUDA_VERSION': '13.0',
    'VLLM_MARLIN_INPUT_DTYPE': None,
    'VLLM_MARLIN_USE_ATOMIC_ADD': 'false',
    'VLLM_MAX_BAD_WORDS_TOTAL_TOKENS': '1024',
    'VLLM_MAX_COMPLETION_PROMPTS': '1024',
    'VLLM_MAX_MEDIA_DOWNLOAD_SIZE_MB': '256',
    'VLLM_MAX_NUM_BAD_WORDS': '128',
    'VLLM_MAX_N_SEQUENCES': '16384',
    'VLLM_MAX_STOP_STRINGS': '4',
    'VLLM_MAX_TOKENS_PER_EXPERT_FP4_MOE': '163840',
    'VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS': 'true',
    'VLLM_MLA_DISABLE': 'false',
    'VLLM_MOE_ROUTING_SIMULATION_STRATEGY': '',
    'VLLM_MOE_SKIP_PADDING': 'true',
    'VLLM_MOE_USE_DEEP_GEMM': 'true',
    'VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT': '480',
    'VLLM_MOONCAKE_BOOTSTRAP_PORT': '8998',
    'VLLM_MOONCAKE_CONNECTOR_TIMEOUT': '30.0',
    'VLLM_MOONCAKE_DISK_STAGING_USABLE_RATIO': '0.9',
    'VLLM_MOONCAKE_LOAD_RECV_THREADS': '1',
    'VLLM_MOONCAKE_STORE_TIER_LOG': 'false',
    'VLLM_MQ_MAX_CHUNK_BYTES_MB': '16',
    'VLLM_MSGPACK_ZERO_COPY_THRESHOLD': '256',
    'VLLM_MULTI_STREAM_GEMM_TOKEN_THRESHOLD': '1024',
    'VLLM_MXFP4_EMULATION_DEQUANT_AT_LOAD': 'false',
    'VLLM_MXFP8_EMULATION_DEQUANT_AT_LOAD': 'true',
    'VLLM_NCCL_INCLUDE_PATH': None,
    'VLLM_NCCL_SO_PATH': None,
    'VLLM_NIC_SELECTION_VARS': '',
    'VLLM_NIXL_SIDE_CHANNEL_PORT': '5600',
    'VLLM_NVTX_SCOPES_FOR_PROFILING': 'false',
    'VLLM_P2P_HANDSHAKE_TIMEOUT_S': '30',
    'VLLM_P2P_IDLE_TIMEOUT_S': '300',
    'VLLM_P2P_MAX_PEERS': '128',
    'VLLM_P2P_SIDE_CHANNEL_HOST': 'localhost',
    'VLLM_P2P_SIDE_CHANNEL_PORT': '5710',
    'VLLM_PATTERN_MATCH_DEBUG': None,
    'VLLM_PLUGINS': None,
    'VLLM_PP_LAYER_PARTITION': None,
    'VLLM_PROCESS_NAME_PREFIX': 'VLLM',
    'VLLM_RAISE_ON_LOGIT_NANS': 'false',
    'VLLM_RAY_BUNDLE_INDICES': '',
    'VLLM_RAY_DP_PACK_STRATEGY': 'strict',
    'VLLM_RAY_DP_PLACEMENT_NODE_IPS': '',
    'VLLM_RAY_EXTRA_ENV_VARS_TO_COPY': '',
    'VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY': '',
    'VLLM_RAY_PER_WORKER_GPUS': '1.0',
    'VLLM_REGEX_COMPILATION_TIMEOUT_S': '5',
    'VLLM_REPLICATE_EMBED': 'false',
    'VLLM_ROCM_AITER_MEGA_MOE_FUSE_SHARED_EXPERTS': 'false',
    'VLLM_ROCM_AITER_MLA_ASM_PADDING': 'auto',
    'VLLM_ROCM_AITER_MLA_DCP_VERIFY': 'auto',
    'VLLM_ROCM_AITER_MOE_DISPATCH_POLICY': '0',
    'VLLM_ROCM_FP8_MFMA_PAGE_ATTN': 'false',
    'VLLM_ROCM_FP8_PADDING': 'true',
    'VLLM_ROCM_MOE_PADDING': 'true',
    'VLLM_ROCM_MONO_DECODE': 'false',
    'VLLM_ROCM_QUICK_REDUCE_CAST_BF16_TO_FP16': 'true',
    'VLLM_ROCM_QUICK_REDUCE_MAX_SIZE_BYTES_MB': None,
    'VLLM_ROCM_QUICK_REDUCE_MIN_SIZE_BYTES_MB': None,
    'VLLM_ROCM_QUICK_REDUCE_QUANTIZATION': 'NONE',
    'VLLM_ROCM_QUICK_REDUCE_QUANTIZATION_MIN_SIZE_KB': None,
    'VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT': 'false',
    'VLLM_ROCM_SLEEP_MEM_CHUNK_SIZE': '256',
    'VLLM_ROCM_USE_AITER': 'false',
    'VLLM_ROCM_USE_AITER_CUSTOM_AR': 'true',
    'VLLM_ROCM_USE_AITER_FP4BMM': 'true',
    'VLLM_ROCM_USE_AITER_FP4_ASM_GEMM': 'false',
    'VLLM_ROCM_USE_AITER_FP8BMM': 'true',
    'VLLM_ROCM_USE_AITER_FUSION_SHARED_EXPERTS': 'false',
    'VLLM_ROCM_USE_AITER_LINEAR': 'true',
    'VLLM_ROCM_USE_AITER_LINEAR_HIPBMM': 'false',
    'VLLM_ROCM_USE_AITER_MHA': 'true',
    'VLLM_ROCM_USE_AITER_MLA': 'true',
    'VLLM_ROCM_USE_AITER_MOE': 'true',
    'VLLM_ROCM_USE_AITER_MOE_A4W4_DSV4': None,
    'VLLM_ROCM_USE_AITER_MOE_SITUV2': 'auto',
    'VLLM_ROCM_USE_AITER_RMSNORM': 'true',
    'VLLM_ROCM_USE_AITER_TRITON_GEMM': 'true',
    'VLLM_ROCM_USE_AITER_TRITON_ROPE': 'false',
    'VLLM_ROCM_USE_AITER_TRITON_SPARSE_MLA': 'false',
    'VLLM_ROCM_USE_AITER_UNIFIED_ATTENTION': 'false',
    'VLLM_ROCM_USE_SKINNY_GEMM': 'true',
    'VLLM_RUST_FRONTEND_PATH': None,
    'VLLM_SHARED_EXPERTS_STREAM_TOKEN_THRESHOLD': '256',
    'VLLM_SKIP_P2P_CHECK': 'true',
    'VLLM_SKIP_PRECOMPILED_VERSION_SUFFIX': 'false',
    'VLLM_SPARSE_INDEXER_MAX_LOGITS_MB': '512',
    'VLLM_SSM_CONV_STATE_LAYOUT': None,
    'VLLM_SYSTEM_START_DATE': None,
    'VLLM_TARGET_DEVICE': 'cuda',
    'VLLM_TOOL_JSON_ERROR_AUTOMATIC_RETRY': 'false',
    'VLLM_TOOL_PARSE_REGEX_TIMEOUT_SECONDS': '1',
    'VLLM_TPU_USING_PATHWAYS': 'false',
    'VLLM_TRACE_FUNCTION': '0',
    'VLLM_TRITON_FORCE_FIRST_CONFIG': 'false',
    'VLLM_TRITON_USE_TD': None,
    'VLLM_USAGE_SOURCE': 'production',
    'VLLM_USE_AOT_COMPILE': 'true',
    'VLLM_USE_BREAKABLE_CUDAGRAPH': 'false',
    'VLLM_USE_BYTECODE_HOOK': 'true',
    'VLLM_USE_DEEP_GEMM': 'true',
    'VLLM_USE_DEEP_GEMM_E8M0': 'true',
    'VLLM_USE_DEEP_GEMM_TMA_ALIGNED_SCALES': 'true',
    'VLLM_USE_DIRECT_DCP_A2A': None,
    'VLLM_USE_DIRECT_DCP_KV_GATHER': None,
    'VLLM_USE_DIRECT_DCP_Q_GATHER': None,
    'VLLM_USE_EXPERIMENTAL_PARSER_CONTEXT': 'false',
    'VLLM_USE_FASTOKENS': 'false',
    'VLLM_USE_FLASHINFER_MOE_INT4': 'false',
    'VLLM_USE_FLASHINFER_SAMPLER': 'true',
    'VLLM_USE_FUSED_MOE_GROUPED_TOPK': 'true',
    'VLLM_USE_HW_AGNOSTIC': 'false',
    'VLLM_USE_LAYERNAME': 'true',
    'VLLM_USE_MEGA_AOT_ARTIFACT': 'true',
    'VLLM_USE_NCCL_SYMM_MEM': 'false',
    'VLLM_USE_OINK_OPS': 'false',
    'VLLM_USE_PRECOMPILED': 'false',
    'VLLM_USE_PRECOMPILED_RUST': 'false',
    'VLLM_USE_RAY_COMPILED_DAG_CHANNEL_TYPE': 'auto',
    'VLLM_USE_RAY_COMPILED_DAG_OVERLAP_COMM': 'false',
    'VLLM_USE_RAY_V2_EXECUTOR_BACKEND': 'true',
    'VLLM_USE_RAY_WRAPPED_PP_COMM': 'true',
    'VLLM_USE_RUST_BENCH': 'false',
    'VLLM_USE_RUST_FRONTEND': 'false',
    'VLLM_USE_SIMPLE_KV_OFFLOAD': 'false',
    'VLLM_USE_SPINLOOP_EXT': 'false',
    'VLLM_USE_STANDALONE_COMPILE': 'true',
    'VLLM_USE_TRITON_AWQ': 'false',
    'VLLM_USE_V2_MODEL_RUNNER': None,
    'VLLM_V1_USE_OUTLINES_CACHE': 'false',
    'VLLM_WEIGHT_OFFLOADING_DISABLE_PIN_MEMORY': 'false',
    'VLLM_WEIGHT_OFFLOADING_DISABLE_UVA': 'false',
    'VLLM_WSL2_ENABLE_PIN_MEMORY': 'false',
    'VLLM_XGRAMMAR_CACHE_MB': '512',
    'VLLM_XLA_CHECK_RECOMPILATION': 'false',
    'VLLM_XLA_USE_SPMD': 'false',
    'VLLM_XPU_FORCE_N_CONTIG_WEIGHT': 'false',
    'VLLM_XPU_INC_WNA16_BACKEND': 'auto',
    'VLLM_XPU_PP_MICROBATCH': 'true',
    'VLLM_XPU_USE_SAMPLER_KERNEL': 'true',
}
"""The environment variables vLLM hashes into its compile key (``envs.compile_factors()``), each with the value
it hashes when the variable is not set."""
