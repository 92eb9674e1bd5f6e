"""The folders of shards a sharded run writes, one file per rank: FSDP2/HSDP's DCP
folder (``dcp.py``, read whole in one process by ``dcp_reader.py``) and DeepSpeed's
ZeRO-2/3 folder (``zero.py``). Both are forms of framework/checkpoint/forms.py.
"""
