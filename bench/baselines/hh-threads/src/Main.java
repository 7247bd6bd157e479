// HeadHunter's thread benchmark ("600 потоков — это много или мало?", ../../../../shared/seeds/000):
// a fixed pool of 1, 2, 4 … 4096 threads, 16 384 tasks of 600 000 random additions each, 2
// warm-ups, then 5 timed runs per pool size. `main`, `test` and `Task` are the article's code;
// what differs is listed in ../README.md (the constants can be set from the command line, and a
// summary table is printed at the end).

import java.util.ArrayList;
import java.util.List;
import java.util.Random;
import java.util.concurrent.Callable;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;

import static java.lang.System.currentTimeMillis;

public class Main {

  // The article's values; `--tasks`, `--iterations`, `--warmups`, `--tests` and `--threads`
  // override them (the lab's `--quick` mode).
  static int numOfWarmUps = 2;
  static int numOfTests = 5;
  static int numOfTasks = 16_384;
  static int numOfIterationsPerTask = 600_000;
  static int[] threadCounts = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096};

  public static void main(String[] args) throws Exception {
    parseArgs(args);
    System.out.println("tasks=" + numOfTasks + " iterations=" + numOfIterationsPerTask
        + " warmups=" + numOfWarmUps + " tests=" + numOfTests
        + " cpus=" + Runtime.getRuntime().availableProcessors()
        + " java=" + System.getProperty("java.version"));
    List<long[]> times = new ArrayList<>();
    List<Double> cpuMs = new ArrayList<>();
    for (int numOfThreads : threadCounts) {
      System.out.println(numOfThreads + " threads.");
      ExecutorService executorService = Executors.newFixedThreadPool(numOfThreads);

      System.out.println("Warming up...");
      for (int i=0; i < numOfWarmUps; i++) {
        test(executorService);
      }

      System.out.println("Testing...");
      long[] runs = new long[numOfTests];
      long cpuStart = processCpuNanos();
      for (int i = 0; i < numOfTests; i++) {
        long start = currentTimeMillis();
        test(executorService);
        runs[i] = currentTimeMillis() - start;
        System.out.println(runs[i]);
      }
      times.add(runs);
      cpuMs.add((processCpuNanos() - cpuStart) / 1e6 / numOfTests);

      executorService.shutdown();
      executorService.awaitTermination(1, TimeUnit.SECONDS);
      System.out.println();
    }
    summary(times, cpuMs);
  }

  static void test(ExecutorService executorService) throws Exception {
    List<Future<Integer>> resultsFutures = new ArrayList<>(numOfTasks);
    for (int i = 0; i < numOfTasks; i++) {
      resultsFutures.add(executorService.submit(new Task()));
    }
    for (Future<Integer> resultFuture : resultsFutures) {
      resultFuture.get();
    }
  }

  static class Task implements Callable<Integer> {
    private final Random random = new Random();
    @Override
    public Integer call() throws InterruptedException {
      int sum = 0;
      for (int i = 0; i < numOfIterationsPerTask; i++) {
        sum += random.nextInt();
      }
      return sum;
    }
  }

  // ---- Not in the article: its table, computed from the runs above. ----

  /// The CPU time of the whole JVM (every thread, user + system), ns; -1 when unknown.
  static long processCpuNanos() {
    java.lang.management.OperatingSystemMXBean os =
        java.lang.management.ManagementFactory.getOperatingSystemMXBean();
    return os instanceof com.sun.management.OperatingSystemMXBean
        ? ((com.sun.management.OperatingSystemMXBean) os).getProcessCpuTime() : -1;
  }

  /// One line per pool size, tab-separated after `RESULT`: threads, mean ms, standard deviation
  /// (sample, n − 1; 0 with one run), difference from the fastest mean in %, the JVM's CPU time
  /// per timed run in ms (mean), the runs in ms.
  static void summary(List<long[]> times, List<Double> cpuMs) {
    double[] means = new double[times.size()];
    double best = Double.MAX_VALUE;
    for (int k = 0; k < times.size(); k++) {
      long sum = 0;
      for (long t : times.get(k)) sum += t;
      means[k] = (double) sum / times.get(k).length;
      best = Math.min(best, means[k]);
    }
    System.out.println("threads\tmean_ms\tstddev_ms\tvs_best_%\tcpu_ms\truns_ms");
    for (int k = 0; k < times.size(); k++) {
      long[] runs = times.get(k);
      double ss = 0;
      for (long t : runs) ss += (t - means[k]) * (t - means[k]);
      double sd = runs.length > 1 ? Math.sqrt(ss / (runs.length - 1)) : 0;
      StringBuilder r = new StringBuilder();
      for (long t : runs) r.append(r.length() == 0 ? "" : ",").append(t);
      System.out.println(String.format(java.util.Locale.ROOT, "RESULT\t%d\t%.1f\t%.1f\t%.2f\t%.0f\t%s",
          threadCounts[k], means[k], sd, (means[k] - best) / best * 100, cpuMs.get(k), r));
    }
  }

  static void parseArgs(String[] args) {
    for (int i = 0; i < args.length; i++) {
      String a = args[i];
      if (i + 1 >= args.length) throw new IllegalArgumentException(a + " needs a value");
      String v = args[++i];
      switch (a) {
        case "--tasks": numOfTasks = Integer.parseInt(v); break;
        case "--iterations": numOfIterationsPerTask = Integer.parseInt(v); break;
        case "--warmups": numOfWarmUps = Integer.parseInt(v); break;
        case "--tests": numOfTests = Integer.parseInt(v); break;
        case "--threads": {
          String[] parts = v.split(",");
          threadCounts = new int[parts.length];
          for (int k = 0; k < parts.length; k++) threadCounts[k] = Integer.parseInt(parts[k].trim());
          break;
        }
        default: throw new IllegalArgumentException("unknown argument " + a
            + " (--tasks N --iterations N --warmups N --tests N --threads 1,2,4)");
      }
    }
  }
}
