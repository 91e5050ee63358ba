// The built-in word lists of RULER's tasks: contract in worker/job/ruler.h. Written for oomb
// (common English words), standing in for the wonderwords lists RULER draws from.
#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "worker/job/ruler.h"

namespace oomb {
namespace {

constexpr char kAdjectives[] =
    "able absent acid active actual afraid agile alert alive amber ancient angry anxious arctic aware awful bad "
    "bald bare basic bent best big bitter black bland blank blind blond blue blunt bold bored brave brief bright "
    "brisk broad broken brown busy calm candid careful casual cheap cheerful chief chilly civil classic clean "
    "clear clever close cloudy clumsy coarse cold common cool cozy crazy crisp crooked crowded cruel curly curved "
    "cute damp dark dear deep dense dirty distant dizzy double dry dull dusty eager early easy elder empty "
    "endless equal even exact exotic extra faint fair false famous fancy far fast fat fierce fine firm flat "
    "fluffy fond foolish formal fragile frank free fresh friendly frozen full funny fuzzy gentle giant glad "
    "gloomy golden good graceful grand gray great green grim gross grumpy guilty hairy handy happy hard harsh "
    "heavy helpful hidden high hollow holy honest hot huge humble hungry icy idle ill jolly juicy keen kind large "
    "late lazy lean legal level light little lively local lonely long loose loud lovely low loyal lucky mad magic "
    "major mellow mild minor misty modern modest moist narrow nasty neat nervous new nice noble noisy normal odd "
    "old open orange plain polite poor precious pretty proud pure purple quick quiet rapid rare raw ready real "
    "red rich rigid ripe rough round royal rude rusty sad safe salty sandy scary secret sharp shiny short shy "
    "silent silly simple sleepy slim slow small smart smooth soft solid sour spare spicy square stale steady "
    "steep sticky stiff still strange strict strong sturdy subtle sudden sunny super sweet swift tall tame tart "
    "tender thick thin tidy tight tiny tired tough true ugly unique upper urban useful vague vast violet vivid "
    "warm weak weary wet white whole wicked wide wild wise witty wooden young zealous";

constexpr char kNouns[] =
    "acorn actor airport alarm album anchor angle animal ankle answer apple apron arch arm army arrow artist "
    "attic author autumn avenue baby badge bag bakery ball balloon banana band bank barn basket bath beach bead "
    "beam bean bear beard bed bee beetle bell belt bench berry bicycle bird blade blanket block boat body bone "
    "book boot bottle boulder bowl box brain branch bread brick bridge broom brother brush bubble bucket bulb "
    "bunny bus butter button cabin cable cactus cake camel camera camp canal candle canoe canyon cap captain car "
    "card carpet carrot cart castle cat cattle cave ceiling cellar chain chair chalk cheese cherry chest chicken "
    "child chimney church circle city clam cliff clock cloud clover coast coat coffee coin comet cook copper corn "
    "cottage cotton cousin cow crab cradle crane crayon creek crow crown cup curtain cushion daisy dancer deer "
    "desert desk diamond dinner doctor dog doll dolphin donkey door dragon drawer dream dress drum duck eagle ear "
    "earth egg elbow elephant engine falcon farm feather fence fern field finger fire fish flag flame flower "
    "flute fog forest fork fossil fountain fox frog fruit garden gate ghost giraffe glass glove goat gold goose "
    "grape grass guitar hammer harbor harp hat hawk heart hedge helmet hill honey horse hotel house island jacket "
    "jar jelly jewel kettle key kitchen kite kitten knee knife ladder lake lamp lantern leaf lemon letter library "
    "lion lizard lobster lock magnet mango map marble meadow melon mirror monkey moon mountain mouse mushroom "
    "needle nest night oak ocean olive onion orchard otter owl oyster paint palace panda paper parrot peach pearl "
    "pencil pepper piano pig pillow pilot pine planet plate plum pocket pond potato puppet quilt rabbit radio "
    "rain raven ribbon river road robin rock rocket roof rose saddle sail salmon sand scarf school seal shadow "
    "shark sheep shell ship shoe shovel silver sister sky snail snake sock sofa spider spoon squirrel stairs star "
    "stone storm stove street sugar sun swan sword table tiger toast tomato tower train tree trumpet tulip turtle "
    "umbrella valley vase violin wagon wall walnut water whale wheel window wolf yard zebra";

constexpr char kVerbs[] =
    "accept add admire agree allow argue arrive ask bake balance bathe beg behave believe belong bless blink boil "
    "borrow bounce breathe brush build bump burn bury buzz calculate call camp carry carve cause chase cheer chew "
    "choke clap clean climb collect comb compare complain cough count crawl cross cry cycle dance decide deliver "
    "describe dig divide doubt drag dream dress drift drop dust earn educate enjoy enter escape examine explain "
    "fetch fill float fold follow forgive gather gaze giggle glow grab greet grin guard guess hammer handle hang "
    "happen hop hover hug hum hunt hurry imagine inform invent invite itch jog juggle jump kneel knit knock laugh "
    "learn lick lift listen marry melt mix mourn move nod notice obey offer open paddle paint pause peel pinch "
    "plant play pour pray preach pretend print pull punch push question race rain reach read relax remember "
    "repair repeat rescue rest return rhyme rinse roll rush sail scatter scold scream search shiver shout sigh "
    "sing skip sleep slide smell smile sneeze snore sparkle spill splash stare steer stir stretch stroll study "
    "swim tease thank tickle tiptoe travel trust tumble twist unite unlock vanish visit wait walk wander wash "
    "watch wave whisper whistle wink wish wonder worry wrap yawn yell zoom";

std::vector<std::string> Sorted(std::vector<std::string> words) {
  std::sort(words.begin(), words.end());
  words.erase(std::unique(words.begin(), words.end()), words.end());
  return words;
}

std::vector<std::string> Words(const char* text) { return Sorted(absl::StrSplit(text, ' ', absl::SkipEmpty())); }

}  // namespace

const std::vector<std::string>& RulerAdjectives() {
  static const auto* const words = new std::vector<std::string>(Words(kAdjectives));
  return *words;
}

const std::vector<std::string>& RulerNouns() {
  static const auto* const words = new std::vector<std::string>(Words(kNouns));
  return *words;
}

const std::vector<std::string>& RulerCommonWords() {
  static const auto* const words = [] {
    std::vector<std::string> all = Words(kNouns);
    for (const char* list : {kAdjectives, kVerbs}) {
      for (std::string& w : Words(list)) all.push_back(std::move(w));
    }
    return new std::vector<std::string>(Sorted(std::move(all)));
  }();
  return *words;
}

}  // namespace oomb
