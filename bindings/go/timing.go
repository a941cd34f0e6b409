package tether

import (
	"fmt"
	"math"
	"sort"
	"time"
)

// TimeOptions are time_evaluator's settings (rpc_server/tether_rpc/timing.py): Warmup untimed calls, then
// Repeat samples of Number calls each, where Number first grows until one sample lasts MinRepeat; Cooldown
// between samples. OnSample, if set, is called as each sample is measured.
type TimeOptions struct {
	Number    int
	Repeat    int
	MinRepeat time.Duration
	Warmup    int
	Cooldown  time.Duration
	OnSample  func(index int, perCall time.Duration, number int)
}

// DefaultTimeOptions are the Python runtime's defaults: number 10, repeat 3, warmup 1.
func DefaultTimeOptions() TimeOptions { return TimeOptions{Number: 10, Repeat: 3, Warmup: 1} }

// Timing holds the samples (seconds per call) and the number of calls each sample averaged.
type Timing struct {
	Samples []float64
	Number  int
}

// Median is the median sample in seconds.
func (t Timing) Median() float64 {
	s := append([]float64(nil), t.Samples...)
	sort.Float64s(s)
	n := len(s)
	if n == 0 {
		return math.NaN()
	}
	if n%2 == 1 {
		return s[n/2]
	}
	return 0.5 * (s[n/2-1] + s[n/2])
}

// Mean is the mean sample in seconds.
func (t Timing) Mean() float64 {
	sum := 0.0
	for _, v := range t.Samples {
		sum += v
	}
	return sum / float64(len(t.Samples))
}

// Min is the fastest sample in seconds.
func (t Timing) Min() float64 {
	m := math.Inf(1)
	for _, v := range t.Samples {
		m = math.Min(m, v)
	}
	return m
}

const (
	maxNumber            = 1 << 30
	maxCalibrationRounds = 32
)

func runN(call func() error, number int) (time.Duration, error) {
	t0 := time.Now()
	for i := 0; i < number; i++ {
		if err := call(); err != nil {
			return 0, err
		}
	}
	return time.Since(t0), nil
}

// TimeEvaluator times call as the Python runtime's time_evaluator does; the first error stops it.
func TimeEvaluator(call func() error, o TimeOptions) (Timing, error) {
	number, repeat := o.Number, o.Repeat
	if number < 1 || repeat < 1 {
		return Timing{}, fmt.Errorf("tether: time_evaluator: number and repeat must be >= 1 (got number=%d, repeat=%d)", number, repeat)
	}
	for i := 0; i < o.Warmup; i++ {
		if err := call(); err != nil {
			return Timing{}, err
		}
	}
	if o.MinRepeat > 0 {
		for r := 0; r < maxCalibrationRounds; r++ {
			elapsed, err := runN(call, number)
			if err != nil {
				return Timing{}, err
			}
			if elapsed >= o.MinRepeat || number >= maxNumber {
				break
			}
			guess := float64(number * 10)
			if elapsed > 0 { // aim 20% past the target so the first sample does not fall just short
				guess = float64(number) * 1.2 * float64(o.MinRepeat) / float64(elapsed)
			}
			number = int(math.Min(maxNumber, math.Max(float64(2*number), math.Ceil(guess))))
		}
	}
	res := Timing{Number: number}
	for i := 0; i < repeat; i++ {
		if o.Cooldown > 0 && i > 0 {
			time.Sleep(o.Cooldown)
		}
		elapsed, err := runN(call, number)
		if err != nil {
			return Timing{}, err
		}
		per := elapsed / time.Duration(number)
		res.Samples = append(res.Samples, elapsed.Seconds()/float64(number))
		if o.OnSample != nil {
			o.OnSample(i, per, number)
		}
	}
	return res, nil
}

// TimeEvaluator times the function on args (converted once, as Bind does).
func (f *Function) TimeEvaluator(o TimeOptions, args ...any) (Timing, error) {
	b, err := f.Bind(args...)
	if err != nil {
		return Timing{}, err
	}
	defer b.Close()
	return TimeEvaluator(b.Run, o)
}
