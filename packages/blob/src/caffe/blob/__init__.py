"""caffe.blob: SyncedMemory, Blob and the runtime context (Caffe's per-thread singleton)."""
from caffe.blob import context
from caffe.blob.context import NoGPUError
from caffe.blob.syncedmem import SyncedMemory, UNINITIALIZED, HEAD_AT_CPU, HEAD_AT_GPU, SYNCED
from caffe.blob.blob import Blob, MAX_BLOB_AXES

__all__ = ["Blob", "SyncedMemory", "context", "NoGPUError", "MAX_BLOB_AXES",
           "UNINITIALIZED", "HEAD_AT_CPU", "HEAD_AT_GPU", "SYNCED"]
