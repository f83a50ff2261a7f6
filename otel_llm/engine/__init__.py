"""Engine side: what runs inside the scheduler loop and does the minimum. `StepRecorder` (`recorder`)
stamps lifecycle events and step outputs and hands the frontend one `bytes` per step in the wire
format of `step`; `kv_residency` samples KV block residency (vLLM's --kv-cache-metrics).
Importable without torch.
"""
