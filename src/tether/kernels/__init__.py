"""Graph op -> kernel: the op table (``table.OPS``), whose entry for each graph op holds its definition (fusion
pattern, shape rule, numpy reference) and, per target kind, its strategy (te compute + schedule, loop IR written
directly, or numpy run on the device). ``registry`` holds the types; ``core``, ``quantize_ops``, ``qconv_ops``,
``qlayout_ops``, ``qpool_ops``, ``recurrent_op`` and ``loop_op`` define ops; ``core_te``, ``softmax_kernel``,
``recurrent_kernel`` (and the op modules' ``CPU_STRATEGIES``) are the CPU strategies. Nothing is imported here.
"""
