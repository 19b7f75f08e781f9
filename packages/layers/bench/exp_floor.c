/* The exp floor for the softmax forward (issue 12, item 1): 6.42M float32 exps (8x256x56x56) on this machine.

   gcc -O3 -mavx2 -mfma -ffp-contract=off -fno-math-errno -fno-trapping-math -fopenmp \
       packages/layers/bench/exp_floor.c -o /tmp/exp_floor -lm
   OMP_NUM_THREADS=1 /tmp/exp_floor;  OMP_NUM_THREADS=2 OMP_WAIT_POLICY=PASSIVE /tmp/exp_floor

   "L1": each thread runs its share of the exps over an 8 KB block that stays in L1 (pure compute);
   "DRAM->DRAM": one pass reading x from and writing y to main memory (a bare exp layer). "poly" is the
   softmax kernels' float32 exp (Cephes' polynomial with FMA, as in kernels/softmax.pyx), "mvec" glibc's
   libmvec expf (8-wide AVX2), what the elementwise Exp kernel calls. Best of 15, wall clock.
*/
#include <stdint.h>
#include <string.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <omp.h>
#pragma omp declare simd notinbranch
extern float expf(float);
static inline float fexp(float x) {
    const float big = 12582912.0f;
    float xc = x < -88.0f ? -88.0f : x;
    float t = fmaf(xc, 1.44269504088896341f, big);
    uint32_t tb, sb; float fx, r, p, scale;
    memcpy(&tb, &t, 4);
    fx = t - big;
    r = fmaf(fx, -0.693359375f, xc);
    r = fmaf(fx, 2.12194440e-4f, r);
    p = fmaf(1.9875691500e-4f, r, 1.3981999507e-3f);
    p = fmaf(p, r, 8.3334519073e-3f);
    p = fmaf(p, r, 4.1665795894e-2f);
    p = fmaf(p, r, 1.6666665459e-1f);
    p = fmaf(p, r, 5.0000001201e-1f);
    p = fmaf(p, r * r, r) + 1.0f;
    sb = (tb - 0x4B400000u + 127u) << 23;
    memcpy(&scale, &sb, 4);
    return x < -87.33654f ? 0.0f : p * scale;
}
static double wall(void){ struct timespec ts; clock_gettime(CLOCK_MONOTONIC,&ts); return ts.tv_sec+ts.tv_nsec*1e-9; }
__attribute__((noinline)) void exp_poly(const float* restrict x, float* restrict y, long n) { for (long i=0;i<n;i++) y[i]=fexp(x[i]); }
__attribute__((noinline)) void exp_mvec(const float* restrict x, float* restrict y, long n) { for (long i=0;i<n;i++) y[i]=expf(x[i]); }
int main(){
  long n = 8L*256*3136; float *x = aligned_alloc(4096, n*4), *y = aligned_alloc(4096, n*4);
  for (long i=0;i<n;i++){ x[i] = -(float)((i*2654435761u)%10000)/1000.0f; y[i]=0; }
  for (int which=0; which<4; which++) { double best=1e9;
    for (int r=0;r<15;r++){ double t=wall();
      if (which<2) {
      #pragma omp parallel
      { int id=omp_get_thread_num(), nt=omp_get_num_threads(); long chunk=n/nt; 
        /* each thread: its share of elements, computed in an 8KB L1 block, over and over */
        float* xb = x + id*4096; float* yb = y + id*4096 + 2048*0;
        for (long k=0;k<chunk;k+=2048) { if (which==0) exp_poly(xb, yb+ (id?0:0), 2048); else exp_mvec(xb, yb, 2048); } }
      } else {
      #pragma omp parallel for schedule(static)
      for (long b=0;b<n;b+=65536) { long e = b+65536<n?65536:n-b; if (which==2) exp_poly(x+b,y+b,e); else exp_mvec(x+b,y+b,e); }
      }
      t=wall()-t; if(t<best)best=t; }
    printf("%s threads %d: %.2f ms for 6.4M exps\n", which==0?"poly L1":which==1?"mvec L1":which==2?"poly DRAM->DRAM":"mvec DRAM->DRAM", omp_get_max_threads(), best*1e3); }
}
