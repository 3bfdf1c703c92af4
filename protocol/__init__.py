"""zerolayer's wire protocol (docs/PROTOCOL.md): the numbers (wire_consts), the codec and the
signatures (wire), the error codes (errors), the sampling parameters a request carries
(sampling_params) and the same-host ring layout (shm_ring).

Every side imports it and nothing else of each other's: the SDK (zerolayer.client), the
daemon, the XDP loader (bpf/ renders wire_consts into the program's source) and the runtime.
Standard library only, so the `zerolayer-client` distribution ships it beside the SDK.
"""
