package tether

// cpufeatures.go mirrors rpc_server/tether_rpc/cpu_features.py and device_info.cpu_capabilities: what this
// process's CPU can execute (AT_HWCAP/AT_HWCAP2/AT_PLATFORM on ARM, /proc/cpuinfo "flags" on x86_64), what of a
// module's metadata "requires" it lacks, and the preset to rebuild with. Same names, same rules: when nothing is
// known of the CPU, no module is refused for its features.

import (
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
)

// CPUCapabilities is what this CPU runs: ISA level, features, where they were read ("auxv", "cpuinfo" or "":
// unknown) and the target preset whose code it runs ("" when none fits).
type CPUCapabilities struct {
	ISA             string
	Features        []string
	Source          string
	SuggestedTarget string
}

// Linux arch/arm/include/uapi/asm/hwcap.h and arch/arm64/include/uapi/asm/hwcap.h: bit -> name
var (
	armHwcap = map[uint]string{1: "half", 2: "thumb", 4: "fastmult", 6: "vfp", 7: "edsp", 12: "neon", 13: "vfpv3",
		14: "vfpv3d16", 15: "tls", 16: "vfpv4", 17: "idiva", 18: "idivt", 19: "vfpd32", 20: "lpae", 21: "evtstrm"}
	armHwcap2  = map[uint]string{0: "aes", 1: "pmull", 2: "sha1", 3: "sha2", 4: "crc32"}
	arm64Hwcap = map[uint]string{0: "fp", 1: "asimd", 2: "evtstrm", 3: "aes", 4: "pmull", 5: "sha1", 6: "sha2",
		7: "crc32", 8: "atomics", 9: "fphp", 10: "asimdhp", 11: "cpuid", 12: "asimdrdm", 13: "jscvt", 14: "fcma",
		15: "lrcpc", 16: "dcpop", 17: "sha3", 18: "sm3", 19: "sm4", 20: "asimddp", 21: "sha512", 22: "sve",
		23: "asimdfhm", 24: "dit", 25: "uscat", 26: "ilrcpc", 27: "flagm", 28: "ssbs", 29: "sb", 30: "paca",
		31: "pacg"}
	arm64Hwcap2 = map[uint]string{0: "dcpodp", 1: "sve2", 13: "i8mm", 14: "bf16"}

	isaLevels = map[string]int{"armv7": 0, "armv8": 1}
	// What each ISA level adds, for error messages.
	isaWhat = map[string]string{"armv8": "ARMv8-A instructions (lda/stl acquire-release, vsel, vrint, vmaxnm)"}

	// /proc/cpuinfo's "CPU implementer" -> {"CPU part" -> core name} (device_info._PARTS_BY_IMPLEMENTER).
	cpuParts = map[int64]map[int64]string{
		0x41: {0xc05: "cortex-a5", 0xc07: "cortex-a7", 0xc08: "cortex-a8", 0xc09: "cortex-a9", 0xc0d: "cortex-a12",
			0xc0e: "cortex-a17", 0xc0f: "cortex-a15", 0xd02: "cortex-a34", 0xd03: "cortex-a53", 0xd04: "cortex-a35",
			0xd05: "cortex-a55", 0xd06: "cortex-a65", 0xd07: "cortex-a57", 0xd08: "cortex-a72", 0xd09: "cortex-a73",
			0xd0a: "cortex-a75", 0xd0b: "cortex-a76", 0xd0c: "neoverse-n1", 0xd0d: "cortex-a77", 0xd0e: "cortex-a76ae",
			0xd40: "neoverse-v1", 0xd41: "cortex-a78", 0xd44: "cortex-x1", 0xd46: "cortex-a510", 0xd47: "cortex-a710",
			0xd48: "cortex-x2", 0xd49: "neoverse-n2", 0xd4d: "cortex-a715", 0xd4e: "cortex-x3", 0xd4f: "neoverse-v2",
			0xd80: "cortex-a520", 0xd81: "cortex-a720", 0xd82: "cortex-x4"},
		0x51: {0x800: "cortex-a73", 0x801: "cortex-a53", 0x802: "cortex-a75", 0x803: "cortex-a55", 0x804: "cortex-a76",
			0x805: "cortex-a55"},
	}
	// First matching core wins (device_info._AARCH64_PRESETS / _ARMV7_PRESETS).
	aarch64Presets = [][2]string{{"cortex-a76", "rasp5"}, {"cortex-a72", "rasp4b"}, {"cortex-a57", "jetson-nano"}}
	armv7Presets   = [][2]string{{"cortex-a53", "rasp3b"}, {"cortex-a7", "armv7-a7"}}
)

// cpuinfo is the part of device_info.parse_cpuinfo that capabilities use.
type cpuinfo struct {
	features     []string // lower-cased, sorted, unique
	featuresKey  string   // "features" (ARM), "flags" (x86) or ""
	architecture string
	cores        []string
}

func parseCPUInfo(text string) cpuinfo {
	var out cpuinfo
	feats, cores := map[string]bool{}, map[string]bool{}
	archSet, implementer, haveImpl := false, int64(0), false
	for _, line := range strings.Split(text, "\n") {
		key, value, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		key, value = strings.ToLower(strings.TrimSpace(key)), strings.TrimSpace(value)
		switch key {
		case "features", "flags":
			for _, w := range strings.Fields(value) {
				feats[strings.ToLower(w)] = true
			}
			out.featuresKey = key
		case "cpu architecture":
			if !archSet {
				out.architecture, archSet = value, true
			}
		case "cpu implementer":
			v, err := strconv.ParseInt(value, 0, 64)
			implementer, haveImpl = v, err == nil
		case "cpu part":
			part, err := strconv.ParseInt(value, 0, 64)
			if err != nil {
				continue
			}
			impl := implementer
			if !haveImpl {
				impl = 0
			}
			name, ok := cpuParts[impl][part]
			if !ok || !haveImpl {
				name = "unknown-0x" + strconv.FormatInt(impl, 16) + "-0x" + pad3(strconv.FormatInt(part, 16))
			}
			cores[name] = true
		}
	}
	out.features, out.cores = sortedKeys(feats), sortedKeys(cores)
	return out
}

func pad3(s string) string {
	for len(s) < 3 {
		s = "0" + s
	}
	return s
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func bitNames(v uint64, names map[uint]string) []string {
	var out []string
	for bit, name := range names {
		if v>>bit&1 == 1 {
			out = append(out, name)
		}
	}
	return out
}

func isARMv8Core(core string) bool {
	if strings.HasPrefix(core, "cortex-x") || strings.HasPrefix(core, "neoverse-") {
		return true
	}
	if !strings.HasPrefix(core, "cortex-a") {
		return false
	}
	n, err := strconv.Atoi(core[len("cortex-a"):])
	return err == nil && n >= 32 && !strings.ContainsAny(core[len("cortex-a"):], "+-")
}

// capabilities is cpu_features.capabilities for arch with this cpuinfo and auxiliary vector.
func capabilities(arch string, ci cpuinfo, hwcap, hwcap2 uint64, platform string) CPUCapabilities {
	if arch == "x86_64" {
		src := ""
		if len(ci.features) > 0 {
			src = "cpuinfo"
		}
		return CPUCapabilities{ISA: "x86_64", Features: ci.features, Source: src}
	}
	if arch != "aarch64" && arch != "armv7" {
		return CPUCapabilities{ISA: arch, Features: []string{}}
	}
	feats, src := map[string]bool{}, ""
	if hwcap != 0 {
		t1, t2 := armHwcap, armHwcap2
		if arch == "aarch64" {
			t1, t2 = arm64Hwcap, arm64Hwcap2
		}
		for _, f := range append(bitNames(hwcap, t1), bitNames(hwcap2, t2)...) {
			feats[f] = true
		}
		src = "auxv"
	} else if ci.featuresKey == "features" { // ARM's own cpuinfo, not an emulator host's x86 "flags"
		for _, f := range ci.features {
			feats[f] = true
		}
		src = "cpuinfo"
	}
	features := sortedKeys(feats)
	if arch == "aarch64" {
		return CPUCapabilities{ISA: "armv8", Features: features, Source: src}
	}
	v8 := strings.HasPrefix(platform, "v8") || feats["crc32"] || ci.architecture == "8"
	for _, c := range ci.cores {
		v8 = v8 || isARMv8Core(c)
	}
	isa := "armv7"
	if v8 {
		isa = "armv8"
	}
	return CPUCapabilities{ISA: isa, Features: features, Source: src}
}

// missingFeatures is cpu_features.missing: what of req this CPU lacks (nil when it runs here or either side is
// unknown).
// requires is the metadata's "requires" as JSON decoded it: anything but an object asks nothing.
func missingFeatures(requires any, caps CPUCapabilities) []string {
	req, ok := requires.(map[string]any)
	if !ok || caps.Source == "" {
		return nil
	}
	var out []string
	isa, _ := req["isa"].(string)
	have, hok := isaLevels[caps.ISA]
	need, nok := isaLevels[isa]
	if hok && nok && need > have {
		if w, ok := isaWhat[isa]; ok {
			out = append(out, w)
		} else {
			out = append(out, isa)
		}
	}
	needed, _ := req["features"].([]any)
	haveF := map[string]bool{}
	for _, f := range caps.Features {
		haveF[f] = true
	}
	for _, f := range needed {
		if s, ok := f.(string); ok && !haveF[s] {
			out = append(out, s)
		}
	}
	return out
}

// suggestPreset is cpu_features.suggest_preset ("" when no preset fits).
func suggestPreset(arch string, caps CPUCapabilities, android bool) string {
	have := map[string]bool{}
	for _, f := range caps.Features {
		have[f] = true
	}
	all := func(fs ...string) bool {
		for _, f := range fs {
			if !have[f] {
				return false
			}
		}
		return true
	}
	switch arch {
	case "x86_64":
		return "host"
	case "aarch64":
		if android {
			return "android-arm64"
		}
		if all("atomics", "lrcpc", "asimddp", "fphp", "asimdhp") {
			return "rasp5"
		}
		return "rasp4b"
	case "armv7":
		if caps.ISA == "armv8" {
			return "rasp3b"
		}
		if all("neon", "vfpv4", "idiva") {
			return "armv7-a7"
		}
	}
	return ""
}

// suggestTarget is device_info.suggest_target: a known board by its cores, else the bare arch name.
func suggestTarget(arch string, cores []string, android bool) string {
	table := armv7Presets
	switch arch {
	case "aarch64":
		if android {
			return "android-arm64"
		}
		table = aarch64Presets
	case "armv7":
	default:
		return arch
	}
	for _, cp := range table {
		for _, c := range cores {
			if c == cp[0] {
				return cp[1]
			}
		}
	}
	return arch
}

func isAndroid() bool {
	if os.Getenv("ANDROID_ROOT") != "" || os.Getenv("ANDROID_DATA") != "" {
		return true
	}
	_, err := os.Stat("/system/build.prop")
	return err == nil
}

var (
	cpuOnce sync.Once
	cpuCaps CPUCapabilities
)

// ThisCPU is what this process's CPU runs (device_info.cpu_capabilities), computed once per process.
func ThisCPU() CPUCapabilities {
	cpuOnce.Do(func() {
		arch := hostArch()
		text, _ := os.ReadFile("/proc/cpuinfo")
		ci := parseCPUInfo(string(text))
		var hwcap, hwcap2 uint64
		var platform string
		if arch == "aarch64" || arch == "armv7" {
			hwcap, hwcap2, platform = auxv()
		}
		cpuCaps = capabilities(arch, ci, hwcap, hwcap2, platform)
		android := isAndroid()
		preset := suggestTarget(arch, ci.cores, android)
		if preset == arch || preset == "aarch64" || preset == "armv7" {
			preset = suggestPreset(arch, cpuCaps, android)
		}
		cpuCaps.SuggestedTarget = preset
	})
	return cpuCaps
}

// checkCPU refuses a module whose code needs an ISA level or CPU features this CPU lacks, with the text of the
// Python runtime's ArchMismatch (tether_rpc.module._check_cpu). Modules without "requires" load as before.
func checkCPU(meta *Metadata, label string) error {
	if _, ok := meta.Requires.(map[string]any); !ok {
		return nil
	}
	caps := ThisCPU()
	lacking := missingFeatures(meta.Requires, caps)
	if len(lacking) == 0 {
		return nil
	}
	built := "another CPU"
	for _, k := range []string{"preset", "cpu"} {
		if s, ok := meta.Target[k].(string); ok && s != "" {
			built = s
			break
		}
	}
	hint := "rebuild it for this device's CPU"
	if caps.SuggestedTarget != "" {
		hint = "rebuild it with target='" + caps.SuggestedTarget + "'"
	}
	return &LoadError{Path: label, ArchMismatch: true, Reason: "was built for " + built + " and needs " +
		strings.Join(lacking, ", ") + ", which this device's CPU (" + caps.ISA + ") lacks: " + hint}
}
