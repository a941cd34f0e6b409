"""SPIR-V binary encoding: the opcodes and enumerants tether emits, and a module builder that hands out ids,
interns types and constants, and writes the sections in the order the specification requires.

Only what the Vulkan compute backend (codegen/spirv.py) uses is listed; numbers are from the SPIR-V 1.3 unified
specification and GLSL.std.450.
"""
from __future__ import annotations

import struct
from typing import Dict, List, Sequence, Tuple

MAGIC = 0x07230203
VERSION_1_3 = 0x00010300

# opcode name -> number
OP: Dict[str, int] = {
    "Name": 5, "MemberName": 6, "Extension": 10, "ExtInstImport": 11, "ExtInst": 12, "MemoryModel": 14,
    "EntryPoint": 15, "ExecutionMode": 16, "Capability": 17,
    "TypeVoid": 19, "TypeBool": 20, "TypeInt": 21, "TypeFloat": 22, "TypeVector": 23, "TypeArray": 28,
    "TypeRuntimeArray": 29, "TypeStruct": 30, "TypePointer": 32, "TypeFunction": 33,
    "ConstantTrue": 41, "ConstantFalse": 42, "Constant": 43,
    "Function": 54, "FunctionEnd": 56, "Variable": 59, "Load": 61, "Store": 62, "AccessChain": 65,
    "Decorate": 71, "MemberDecorate": 72, "CompositeExtract": 81,
    "ConvertFToU": 109, "ConvertFToS": 110, "ConvertSToF": 111, "ConvertUToF": 112, "UConvert": 113,
    "SConvert": 114, "FConvert": 115, "Bitcast": 124,
    "SNegate": 126, "FNegate": 127, "IAdd": 128, "FAdd": 129, "ISub": 130, "FSub": 131, "IMul": 132, "FMul": 133,
    "UDiv": 134, "SDiv": 135, "FDiv": 136, "UMod": 137, "SRem": 138, "SMod": 139,
    "IsNan": 156, "IsInf": 157,
    "LogicalEqual": 164, "LogicalNotEqual": 165, "LogicalOr": 166, "LogicalAnd": 167, "LogicalNot": 168,
    "Select": 169, "IEqual": 170, "INotEqual": 171, "UGreaterThan": 172, "SGreaterThan": 173,
    "UGreaterThanEqual": 174, "SGreaterThanEqual": 175, "ULessThan": 176, "SLessThan": 177,
    "ULessThanEqual": 178, "SLessThanEqual": 179,
    "FOrdEqual": 180, "FUnordEqual": 181, "FOrdNotEqual": 182, "FUnordNotEqual": 183, "FOrdLessThan": 184,
    "FUnordLessThan": 185, "FOrdGreaterThan": 186, "FUnordGreaterThan": 187, "FOrdLessThanEqual": 188,
    "FUnordLessThanEqual": 189, "FOrdGreaterThanEqual": 190, "FUnordGreaterThanEqual": 191,
    "ShiftRightLogical": 194, "ShiftRightArithmetic": 195, "ShiftLeftLogical": 196, "BitwiseOr": 197,
    "BitwiseXor": 198, "BitwiseAnd": 199,
    "ControlBarrier": 224,
    "Phi": 245, "LoopMerge": 246, "SelectionMerge": 247, "Label": 248, "Branch": 249, "BranchConditional": 250,
    "Return": 253,
}

# enumerants
CAP = {"Shader": 1, "Float16": 9, "Float64": 10, "Int64": 11, "Int16": 22, "Int8": 39,
       "StorageBuffer16BitAccess": 4433, "StorageBuffer8BitAccess": 4448}
ADDRESSING_LOGICAL = 0
MEMORY_MODEL_GLSL450 = 1
EXECUTION_MODEL_GLCOMPUTE = 5
EXECUTION_MODE_LOCAL_SIZE = 17
STORAGE = {"Input": 1, "Workgroup": 4, "Function": 7, "PushConstant": 9, "StorageBuffer": 12}
DECORATION = {"Block": 2, "ArrayStride": 6, "BuiltIn": 11, "NonWritable": 24, "Binding": 33, "DescriptorSet": 34,
              "Offset": 35}
BUILTIN = {"WorkgroupId": 26, "LocalInvocationId": 27}
SCOPE_WORKGROUP = 2
SEMANTICS_ACQUIRE_RELEASE = 0x8
SEMANTICS_WORKGROUP_MEMORY = 0x100

# GLSL.std.450 extended instruction numbers
GLSL = {"RoundEven": 2, "FAbs": 4, "Floor": 8, "Ceil": 9, "Sin": 13, "Cos": 14, "Tan": 15, "Asin": 16,
        "Acos": 17, "Atan": 18, "Tanh": 21, "Pow": 26, "Exp": 27, "Log": 28, "Sqrt": 31, "Fma": 50}


def string_words(s: str) -> List[int]:
    """A literal string: UTF-8, nul-terminated, padded with nuls to whole words."""
    data = s.encode("utf-8") + b"\0"
    data += b"\0" * (-len(data) % 4)
    return list(struct.unpack("<%dI" % (len(data) // 4), data))


def instruction(opcode: int, operands: Sequence[int]) -> List[int]:
    return [((len(operands) + 1) << 16) | opcode] + [int(w) & 0xFFFFFFFF for w in operands]


class ModuleBuilder:
    """One SPIR-V module under construction. Types and constants are interned (asked for twice, one id);
    function bodies are appended by the caller through :meth:`emit` into the list it passes."""

    def __init__(self) -> None:
        self.bound = 1
        self.capabilities: List[str] = ["Shader"]
        self.extensions: List[str] = []
        self.entry_points: List[int] = []
        self.execution_modes: List[int] = []
        self.debug: List[int] = []
        self.annotations: List[int] = []
        self.globals: List[int] = []       # types, constants and module-scope variables, in definition order
        self.functions: List[int] = []
        self._interned: Dict[Tuple, int] = {}
        self.glsl = self.new_id()

    def new_id(self) -> int:
        i = self.bound
        self.bound += 1
        return i

    def require(self, capability: str, extension: str | None = None) -> None:
        if capability not in self.capabilities:
            self.capabilities.append(capability)
        if extension is not None and extension not in self.extensions:
            self.extensions.append(extension)

    # ---- sections --------------------------------------------------------------------------------------------
    def name(self, target: int, text: str) -> None:
        self.debug += instruction(OP["Name"], [target] + string_words(text))

    def decorate(self, target: int, decoration: str, *literals: int) -> None:
        self.annotations += instruction(OP["Decorate"], [target, DECORATION[decoration], *literals])

    def member_decorate(self, struct_id: int, member: int, decoration: str, *literals: int) -> None:
        self.annotations += instruction(OP["MemberDecorate"], [struct_id, member, DECORATION[decoration], *literals])

    def global_inst(self, op: str, operands: Sequence[int]) -> None:
        self.globals += instruction(OP[op], operands)

    def _interned_global(self, key: Tuple, op: str, operands: Sequence[int], result_type: int | None = None) -> int:
        found = self._interned.get(key)
        if found is None:
            found = self._interned[key] = self.new_id()
            head = [result_type, found] if result_type is not None else [found]
            self.global_inst(op, head + list(operands))
        return found

    # ---- types -----------------------------------------------------------------------------------------------
    def t_void(self) -> int:
        return self._interned_global(("void",), "TypeVoid", [])

    def t_bool(self) -> int:
        return self._interned_global(("bool",), "TypeBool", [])

    def t_int(self, width: int, signed: bool) -> int:
        return self._interned_global(("int", width, signed), "TypeInt", [width, 1 if signed else 0])

    def t_float(self, width: int) -> int:
        return self._interned_global(("float", width), "TypeFloat", [width])

    def t_vector(self, elem: int, count: int) -> int:
        return self._interned_global(("vec", elem, count), "TypeVector", [elem, count])

    def t_pointer(self, storage: str, pointee: int) -> int:
        return self._interned_global(("ptr", storage, pointee), "TypePointer", [STORAGE[storage], pointee])

    def t_function(self, ret: int, params: Sequence[int] = ()) -> int:
        return self._interned_global(("fn", ret, tuple(params)), "TypeFunction", [ret, *params])

    def t_array(self, elem: int, length: int) -> int:
        n = self.const_int(length, 32, False)
        return self._interned_global(("array", elem, length), "TypeArray", [elem, n])

    def t_laid_out_runtime_array(self, elem: int, stride: int) -> int:
        """``T[]`` decorated with its ArrayStride (for a storage buffer's block)."""
        key = ("rtarray", elem, stride)
        if key not in self._interned:
            arr = self._interned_global(key, "TypeRuntimeArray", [elem])
            self.decorate(arr, "ArrayStride", stride)
        return self._interned[key]

    def t_struct(self, members: Sequence[int]) -> int:
        """A new (never interned) struct type: each block gets its own, so its decorations are its own."""
        sid = self.new_id()
        self.global_inst("TypeStruct", [sid, *members])
        return sid

    # ---- constants -------------------------------------------------------------------------------------------
    def const_bool(self, value: bool) -> int:
        t = self.t_bool()
        return self._interned_global(("cbool", bool(value)), "ConstantTrue" if value else "ConstantFalse", [], t)

    def const_int(self, value: int, width: int, signed: bool) -> int:
        t = self.t_int(width, signed)
        value = int(value) & ((1 << width) - 1)
        if signed and width < 32 and value >> (width - 1):
            value |= 0xFFFFFFFF & ~((1 << width) - 1)      # narrower than a word: sign-extended (the spec's rule)
        words = [value & 0xFFFFFFFF, value >> 32] if width == 64 else [value]
        return self._interned_global(("cint", width, signed, value), "Constant", words, t)

    def const_float(self, value: float, width: int) -> int:
        t = self.t_float(width)
        if width == 64:
            words = list(struct.unpack("<2I", struct.pack("<d", value)))
        elif width == 32:
            words = list(struct.unpack("<I", struct.pack("<f", value)))
        else:
            words = [struct.unpack("<H", struct.pack("<e", value))[0]]
        return self._interned_global(("cfloat", width, tuple(words)), "Constant", words, t)

    # ---- module-scope variables ------------------------------------------------------------------------------
    def variable(self, pointer_type: int, storage: str) -> int:
        vid = self.new_id()
        self.global_inst("Variable", [pointer_type, vid, STORAGE[storage]])
        return vid

    # ---- output ----------------------------------------------------------------------------------------------
    def entry_point(self, function: int, name: str, interface: Sequence[int], local_size: Sequence[int]) -> None:
        self.entry_points += instruction(OP["EntryPoint"], [EXECUTION_MODEL_GLCOMPUTE, function]
                                         + string_words(name) + list(interface))
        self.execution_modes += instruction(OP["ExecutionMode"], [function, EXECUTION_MODE_LOCAL_SIZE,
                                                                  *local_size])

    def to_bytes(self) -> bytes:
        words: List[int] = [MAGIC, VERSION_1_3, 0, self.bound, 0]
        for cap in self.capabilities:
            words += instruction(OP["Capability"], [CAP[cap]])
        for ext in self.extensions:
            words += instruction(OP["Extension"], string_words(ext))
        words += instruction(OP["ExtInstImport"], [self.glsl] + string_words("GLSL.std.450"))
        words += instruction(OP["MemoryModel"], [ADDRESSING_LOGICAL, MEMORY_MODEL_GLSL450])
        words += self.entry_points + self.execution_modes + self.debug + self.annotations
        words += self.globals + self.functions
        return struct.pack("<%dI" % len(words), *words)
