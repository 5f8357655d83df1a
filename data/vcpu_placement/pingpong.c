#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdatomic.h>
#include <time.h>
static _Alignas(64) atomic_int flag = 0;
static int N = 20000;
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static void pin(int c){cpu_set_t s;CPU_ZERO(&s);CPU_SET(c,&s);pthread_setaffinity_np(pthread_self(),sizeof s,&s);}
static void* pong(void* a){pin(1);for(;;){for(int i=0;i<N;i++){while(atomic_load_explicit(&flag,memory_order_acquire)!=1);atomic_store_explicit(&flag,0,memory_order_release);}}return 0;}
int main(int argc,char**argv){double secs=atof(argv[1]); if(argc>2) N=atoi(argv[2]);pthread_t t;pthread_create(&t,0,pong,0);pin(0);double end=now()+secs;
 while(now()<end){double t0=now();for(int i=0;i<N;i++){atomic_store_explicit(&flag,1,memory_order_release);while(atomic_load_explicit(&flag,memory_order_acquire)!=0);}
 printf("%.0f ",(now()-t0)/N*1e9);fflush(stdout);}
 printf("\n");return 0;}
