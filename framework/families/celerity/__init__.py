"""The Celerity family, the paper's decoder: pre-LN, ALiBi attention, squared-ReLU FFN.

Its blocks are framework/model/decoder.py's (every family subclasses that Decoder);
this folder holds its config rules and its spec. It has no transformers class.
"""
